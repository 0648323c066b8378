// Package testserver starts throwaway real servers (redis-server, etcd,
// ZooKeeper, PostgreSQL, MariaDB) on free loopback ports in temporary
// directories for dlock's tests, and stops them at cleanup.
//
// Each kind can instead be pointed at an existing server with an environment
// variable (DLOCK_TEST_REDIS_URL, DLOCK_TEST_ETCD_URL, DLOCK_TEST_ZK_URL,
// DLOCK_TEST_POSTGRES_URL, DLOCK_TEST_MYSQL_URL); fault controls (Kill,
// Restart, Pause) then skip the calling test.
//
// API contract (implemented by the testserver work; backends code against it):
//
//	s := testserver.Redis(t, nil)              // one redis-server
//	ss := testserver.RedisN(t, 3, nil)         // N independent redis-servers (Redlock)
//	c := testserver.Etcd(t, 1)                 // or 3 members
//	z := testserver.ZooKeeper(t, 1)            // or a 3-node ensemble
//	p := testserver.Postgres(t)
//	m := testserver.MariaDB(t)
//
// Every function takes testing.TB, registers cleanup with t.Cleanup, and fails
// the test (t.Fatal) if the server cannot start. A Start* variant returning an
// error and a Stop method serves TestMain, where one server is shared by a
// package's tests.
package testserver
