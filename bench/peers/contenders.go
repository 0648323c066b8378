package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock/dlock"
	"github.com/dlock/dlock/bench/floor"
	_ "github.com/dlock/dlock/etcdlock"
	"github.com/dlock/dlock/locktest"
	_ "github.com/dlock/dlock/mysqllock"
	_ "github.com/dlock/dlock/pglock"
	_ "github.com/dlock/dlock/redislock"
	_ "github.com/dlock/dlock/redlock"
	_ "github.com/dlock/dlock/sqlitelock"
	_ "github.com/dlock/dlock/zklock"
	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// peerTTL is the lease of the peers that do not renew: long enough to hold
// 10,000 locks through the many-held scenario.
const peerTTL = 10 * time.Minute

// kind says what a contender is.
type kind int

const (
	kindFloor kind = iota
	kindDlock
	kindPeer
)

// contender is one way of locking on a backend.
type contender struct {
	name string
	kind kind
	// open connects a client of its own (connections, session), as a
	// separate process would.
	open func(ctx context.Context) (*client, error)
}

// client is one connected contender. once is an uncontended take-and-free of
// name; lock (nil for floors) waits for name.
type client struct {
	once  func(ctx context.Context, name string) error
	lock  func(name string) locktest.LockFunc
	close func()
}

// lockOnce is once for a client with a blocking lock.
func lockOnce(lock func(name string) locktest.LockFunc) func(ctx context.Context, name string) error {
	return func(ctx context.Context, name string) error {
		unlock, err := lock(name)(ctx)
		if err != nil {
			return err
		}
		return unlock(ctx)
	}
}

func newClient(lock func(name string) locktest.LockFunc, close func()) *client {
	return &client{once: lockOnce(lock), lock: lock, close: close}
}

// floorContender is the raw floor of rawURL (bench/floor).
func floorContender(label, rawURL string) contender {
	return contender{name: label, kind: kindFloor, open: func(ctx context.Context) (*client, error) {
		f, err := floor.Open(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		return &client{once: f.AcquireRelease, close: func() { _ = f.Close() }}, nil
	}}
}

// dlockContender is dlock over rawURL, with the URL's defaults.
func dlockContender(label, rawURL string) contender {
	return contender{name: label, kind: kindDlock, open: func(ctx context.Context) (*client, error) {
		c, err := dlock.Open(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		return newClient(func(name string) locktest.LockFunc {
			return locktest.MutexLocker(c.NewMutex(name, nil))
		}, func() { _ = c.Close() }), nil
	}}
}

func redisClient(ctx context.Context, raw string) (*redis.Client, error) {
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(opt)
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// redsyncContender is redsync over one client per node, with its default
// retry delay (random 50–250 ms) and tries unbounded (waits while ctx
// allows).
func redsyncContender(label string, nodes []string) contender {
	return contender{name: label, kind: kindPeer, open: func(ctx context.Context) (*client, error) {
		var pools []rsredis.Pool
		var cs []*redis.Client
		closeAll := func() {
			for _, c := range cs {
				c.Close()
			}
		}
		for _, n := range nodes {
			c, err := redisClient(ctx, n)
			if err != nil {
				closeAll()
				return nil, err
			}
			cs = append(cs, c)
			pools = append(pools, goredis.NewPool(c))
		}
		rs := redsync.New(pools...)
		return newClient(func(name string) locktest.LockFunc {
			return func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex("redsync:"+name, redsync.WithExpiry(peerTTL), redsync.WithTries(math.MaxInt32))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error {
					_, err := m.UnlockContext(ctx)
					return err
				}, nil
			}
		}, closeAll), nil
	}}
}

// bsmContender is bsm/redislock with LinearBackoff(100ms), as in its README.
func bsmContender(label, raw string) contender {
	return contender{name: label, kind: kindPeer, open: func(ctx context.Context) (*client, error) {
		c, err := redisClient(ctx, raw)
		if err != nil {
			return nil, err
		}
		lc := redislock.New(c)
		opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(100 * time.Millisecond)}
		return newClient(func(name string) locktest.LockFunc {
			return func(ctx context.Context) (func(context.Context) error, error) {
				l, err := lc.Obtain(ctx, "bsm:"+name, peerTTL, opt)
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			}
		}, func() { c.Close() }), nil
	}}
}

// etcdMutexContender is concurrency.Mutex on a session of its own.
func etcdMutexContender(label, raw string) contender {
	return contender{name: label, kind: kindPeer, open: func(ctx context.Context) (*client, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		cli, err := clientv3.New(floor.EtcdConfig(u))
		if err != nil {
			return nil, err
		}
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(60), concurrency.WithContext(context.WithoutCancel(ctx)))
		if err != nil {
			cli.Close()
			return nil, err
		}
		return newClient(func(name string) locktest.LockFunc {
			return func(ctx context.Context) (func(context.Context) error, error) {
				m := concurrency.NewMutex(s, "/peers-mutex/"+name)
				if err := m.Lock(ctx); err != nil {
					return nil, err
				}
				return m.Unlock, nil
			}
		}, func() { _ = s.Close(); cli.Close() }), nil
	}}
}

// zkLockContender is go-zookeeper's zk.Lock. zk.Lock waits without a
// context: a wait given up by ctx goes on in the background and frees the
// lock as soon as it gets it.
func zkLockContender(label, raw string) contender {
	return contender{name: label, kind: kindPeer, open: func(ctx context.Context) (*client, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		conn, err := floor.ZKConnect(ctx, u)
		if err != nil {
			return nil, err
		}
		if _, err := conn.Create("/peers-zk", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			conn.Close()
			return nil, err
		}
		return newClient(func(name string) locktest.LockFunc {
			return func(ctx context.Context) (func(context.Context) error, error) {
				l := zk.NewLock(conn, "/peers-zk/"+name, zk.WorldACL(zk.PermAll))
				return blockingLock(ctx, l.Lock, func(context.Context) error { return l.Unlock() })
			}
		}, conn.Close), nil
	}}
}

// blockingLock runs a lock call that takes no context: when ctx ends first,
// the call goes on in the background and unlocks what it gets.
func blockingLock(ctx context.Context, lock func() error, unlock func(context.Context) error) (func(context.Context) error, error) {
	done := make(chan error, 1)
	go func() { done <- lock() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			_ = unlock(context.Background())
			return nil, ctx.Err()
		}
		return unlock, nil
	case <-ctx.Done():
		go func() {
			if <-done == nil {
				_ = unlock(context.Background())
			}
		}()
		return nil, ctx.Err()
	}
}

// pgAdvisoryContender is a hand-written blocking pg_advisory_lock on a
// connection of its own (a session lock; re-entrant per session, so one
// client per goroutine).
func pgAdvisoryContender(label, raw string) contender {
	return contender{name: label, kind: kindPeer, open: func(ctx context.Context) (*client, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		cs, _ := floor.PGConnString(u)
		conn, err := pgx.Connect(ctx, cs)
		if err != nil {
			return nil, err
		}
		return newClient(func(name string) locktest.LockFunc {
			return func(ctx context.Context) (func(context.Context) error, error) {
				if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, name); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error {
					_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, name)
					return err
				}, nil
			}
		}, func() { _ = conn.Close(context.Background()) }), nil
	}}
}

// getLockContender is a hand-written blocking GET_LOCK(name, timeout) on a
// connection of its own.
func getLockContender(label, raw string) contender {
	return contender{name: label, kind: kindPeer, open: func(ctx context.Context) (*client, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		dsn, _ := floor.MySQLDSN(u)
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return nil, err
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			db.Close()
			return nil, err
		}
		return newClient(func(name string) locktest.LockFunc {
			return func(ctx context.Context) (func(context.Context) error, error) {
				var ok sql.NullInt64
				if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 3600)`, name).Scan(&ok); err != nil {
					return nil, err
				}
				if ok.Int64 != 1 {
					return nil, fmt.Errorf("GET_LOCK returned %v", ok)
				}
				return func(ctx context.Context) error {
					return conn.QueryRowContext(ctx, `SELECT RELEASE_LOCK(?)`, name).Scan(&ok)
				}, nil
			}
		}, func() { conn.Close(); db.Close() }), nil
	}}
}

// withQuery returns raw with the query parameter k set to v.
func withQuery(raw, k, v string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// backend is one backend of the comparison with its contenders.
type backend struct {
	name       string
	contenders []contender
}

// backends builds the comparison from the server URLs given (empty ones are
// left out).
func backends(urls serverURLs) ([]backend, error) {
	var out []backend
	if urls.redis != "" {
		out = append(out, backend{"Redis", []contender{
			floorContender("floor: SET NX PX + scripted DEL", urls.redis),
			dlockContender("dlock", urls.redis),
			bsmContender("bsm/redislock", urls.redis),
			redsyncContender("redsync", []string{urls.redis}),
		}})
	}
	if urls.redlock != "" {
		u, err := url.Parse(urls.redlock)
		if err != nil {
			return nil, fmt.Errorf("-redlock: %w", err)
		}
		nodes, err := floor.RedlockNodes(u)
		if err != nil {
			return nil, fmt.Errorf("-redlock: %w", err)
		}
		out = append(out, backend{fmt.Sprintf("Redlock (%d nodes)", len(nodes)), []contender{
			floorContender("floor: SET NX PX + DEL on all nodes", urls.redlock),
			dlockContender("dlock", urls.redlock),
			redsyncContender("redsync", nodes),
		}})
	}
	if urls.etcd != "" {
		out = append(out, backend{"etcd", []contender{
			floorContender("floor: Txn put-if-absent + Delete", urls.etcd),
			dlockContender("dlock", urls.etcd),
			etcdMutexContender("concurrency.Mutex", urls.etcd),
		}})
	}
	if urls.zk != "" {
		out = append(out, backend{"ZooKeeper", []contender{
			floorContender("floor: create ephemeral + delete", urls.zk),
			dlockContender("dlock", urls.zk),
			zkLockContender("zk.Lock", urls.zk),
		}})
	}
	if urls.postgres != "" {
		out = append(out, sqlBackend("PostgreSQL", urls.postgres, "advisory", "pg_try_advisory_lock + unlock",
			pgAdvisoryContender("pg_advisory_lock (hand-written)", urls.postgres)))
	}
	if urls.mysql != "" {
		out = append(out, sqlBackend("MySQL (MariaDB)", urls.mysql, "getlock", "GET_LOCK(n, 0) + RELEASE_LOCK",
			getLockContender("GET_LOCK (hand-written)", urls.mysql)))
	}
	if urls.sqlite != "" {
		out = append(out, backend{"SQLite", []contender{
			floorContender("floor: INSERT + DELETE", urls.sqlite),
			dlockContender("dlock", urls.sqlite),
		}})
	}
	return out, nil
}

// sqlBackend is PostgreSQL or MySQL: the floors of the session mode and of
// the lease mode, dlock in both modes, and the hand-written peer.
func sqlBackend(name, raw, sessionMode, sessionFloor string, peer contender) backend {
	return backend{name, []contender{
		floorContender("floor: "+sessionFloor, withQuery(raw, "mode", sessionMode)),
		floorContender("floor: lease-row upsert + update", withQuery(raw, "mode", "lease")),
		dlockContender("dlock lease", withQuery(raw, "mode", "lease")),
		dlockContender("dlock "+sessionMode, withQuery(raw, "mode", sessionMode)),
		peer,
	}}
}
