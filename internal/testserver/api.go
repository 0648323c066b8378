// Package testserver starts throwaway real servers (redis-server, etcd,
// ZooKeeper, PostgreSQL, MariaDB) on free loopback ports in temporary
// directories for dlock's tests, and stops them at cleanup.
//
//	s := testserver.Redis(t, nil)              // one redis-server
//	ss := testserver.RedisN(t, 3, nil)         // N independent redis-servers (Redlock)
//	c := testserver.Etcd(t, 1)                 // or 3 members
//	z := testserver.ZooKeeper(t, 1)            // or a 3-node ensemble
//	p := testserver.Postgres(t)                // database "dlock", superuser "dlock"
//	m := testserver.MariaDB(t)                 // database "dlock", user root, no password
//
// Every function taking a testing.TB registers cleanup with t.Cleanup, skips
// the test when the server's program is not installed (with CI=true, `make
// test` turns such a skip in a backend package into a failure), and fails the
// test if the server cannot start. The Start* variants return an error
// instead and leave stopping to the caller; they serve TestMain, where one
// server is shared by a package's tests.
//
// A start returns once the server answers a real request (Redis PING, etcd
// /health on every member, ZooKeeper's srvr showing a serving mode, a query on
// PostgreSQL and MariaDB).
//
// # Fault controls
//
// Server.Kill (SIGKILL to the server and every process it started),
// Server.Restart (same port, data kept or wiped), Server.Pause and
// Server.Resume (SIGSTOP/SIGCONT), and Server.SetClockOffset for servers
// started under libfaketime (RedisOptions.Faketime, SQLOptions.Faketime,
// ZooKeeperOptions.Faketime). A Cluster's members each have their own
// controls; Cluster.Leader says which one leads.
//
// # Existing servers
//
// Each kind can instead be pointed at an existing server with an environment
// variable: DLOCK_TEST_REDIS_URL (a comma-separated list for RedisN),
// DLOCK_TEST_ETCD_URL, DLOCK_TEST_ZK_URL, DLOCK_TEST_POSTGRES_URL,
// DLOCK_TEST_MYSQL_URL. Fault controls on such a server skip the calling test
// (or, without a test, return ErrExternal), as do options an external server
// cannot honour (AppendOnly, Faketime). Tests must then tolerate data left by
// earlier runs.
//
// # Other environment
//
// DLOCK_TEST_TMPDIR sets where temporary directories go (default /dev/shm when
// it is a roomy tmpfs, else the system temporary directory).
// DLOCK_TEST_CACHE sets where initialised PostgreSQL and MariaDB data
// directories are cached (default the user's cache directory; "off" disables
// the cache).
package testserver
