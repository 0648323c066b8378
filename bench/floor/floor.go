// Package floor opens the raw floor of a dlock backend URL: the cheapest way
// to take and free a lock with the backend's bare primitives, on one
// connection of its own, without dlock. "dlock bench" and the peer comparison
// in bench/peers time it beside dlock in the same run, so results can be
// read as ratios on a noisy machine.
//
// The floors, by scheme:
//
//	mem://       insert and delete in a map under a mutex
//	sqlite://    INSERT and DELETE of a row (two transactions, WAL, synchronous=FULL)
//	redis://     SET NX PX, then a scripted compare-and-delete
//	redlock://   the same on every node in parallel
//	etcd://      a put-if-absent Txn bound to a lease, then Delete
//	zk://        create an ephemeral node, then delete it
//	postgres://  mode=advisory: pg_try_advisory_lock + pg_advisory_unlock;
//	             other modes: an upsert of a lease row + an update freeing it
//	mysql://     mode=getlock: GET_LOCK(name, 0) + RELEASE_LOCK;
//	             other modes: an upsert of a lease row + an update freeing it
//
// RoundTrip is one bare request on the same kind of connection (PING,
// SELECT 1, a put, a setData).
package floor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/internal/openurl"
	"github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, as sqlitelock's
)

// Floor is the raw floor of one backend. Its functions are not safe for
// concurrent use: they share one connection, as a floor should.
type Floor struct {
	// Desc names the primitives, e.g. "SET NX PX + scripted delete".
	Desc string
	// AcquireRelease takes and frees key; key must not be held by anyone.
	AcquireRelease func(ctx context.Context, key string) error
	// RoundTrip is one bare request.
	RoundTrip func(ctx context.Context) error
	close     []func() error
}

// Close closes the floor's connections.
func (f *Floor) Close() error {
	var errs []error
	for _, c := range f.close {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// ErrUnsupported is returned (wrapped) by Open for a scheme without a floor.
var ErrUnsupported = errors.New("floor: no raw floor for this scheme")

// Open connects the floor of rawURL, a dlock backend URL. Its errors never
// contain the URL's password.
func Open(ctx context.Context, rawURL string) (*Floor, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("floor: bad URL: %w", openurl.ScrubError(err, openurl.SecretsOf(rawURL)))
	}
	var f *Floor
	switch u.Scheme {
	case "mem":
		f = memFloor()
	case "sqlite":
		f, err = sqliteFloor(ctx, u)
	case "redis", "rediss":
		f, err = redisFloor(ctx, u)
	case "redlock":
		f, err = redlockFloor(ctx, u)
	case "etcd":
		f, err = etcdFloor(ctx, u)
	case "zk":
		f, err = zkFloor(ctx, u)
	case "postgres", "postgresql":
		f, err = pgFloor(ctx, u)
	case "mysql":
		f, err = mysqlFloor(ctx, u)
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnsupported, u.Scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("floor: %s: %w", u.Scheme, openurl.RedactError(err, u))
	}
	return f, nil
}

func memFloor() *Floor {
	var (
		mu sync.Mutex
		m  = map[string]string{}
	)
	return &Floor{
		Desc: "map insert + delete under a mutex",
		AcquireRelease: func(ctx context.Context, key string) error {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := m[key]; ok {
				return errors.New("key held")
			}
			m[key] = "x"
			delete(m, key)
			return nil
		},
		RoundTrip: func(ctx context.Context) error {
			mu.Lock()
			_ = m[""]
			mu.Unlock()
			return nil
		},
	}
}

func sqliteFloor(ctx context.Context, u *url.URL) (*Floor, error) {
	path := u.Path
	if u.Host != "" { // sqlite://rel/locks.db is relative
		path = u.Host + u.Path
	}
	if path == "" {
		return nil, errors.New("no file path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: abs, RawQuery: q.Encode()}).String())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor (name TEXT PRIMARY KEY, owner TEXT, until INTEGER)`); err != nil {
		db.Close()
		return nil, err
	}
	return &Floor{
		Desc: "INSERT + DELETE of a row",
		AcquireRelease: func(ctx context.Context, key string) error {
			if _, err := db.ExecContext(ctx, `INSERT INTO dlock_floor VALUES (?, 'x', ?)`, key, time.Now().Add(time.Minute).UnixMilli()); err != nil {
				return err
			}
			_, err := db.ExecContext(ctx, `DELETE FROM dlock_floor WHERE name = ? AND owner = 'x'`, key)
			return err
		},
		RoundTrip: func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, `SELECT 1`)
			return err
		},
		close: []func() error{db.Close},
	}, nil
}

// compareAndDelete is the owner-checked release of the Redis floors.
var compareAndDelete = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`)

func redisClient(ctx context.Context, raw string) (*redis.Client, error) {
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	opt.PoolSize = 1
	c := redis.NewClient(opt)
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// RedisAcquireRelease is the Redis floor on c: SET key NX PX, then a
// scripted compare-and-delete.
func RedisAcquireRelease(ctx context.Context, c redis.Cmdable, key string) error {
	ok, err := c.SetNX(ctx, key, "floor", 30*time.Second).Result()
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("key held")
	}
	return compareAndDelete.Run(ctx, c, []string{key}, "floor").Err()
}

func redisFloor(ctx context.Context, u *url.URL) (*Floor, error) {
	c, err := redisClient(ctx, u.String())
	if err != nil {
		return nil, err
	}
	return &Floor{
		Desc:           "SET NX PX + scripted delete",
		AcquireRelease: func(ctx context.Context, key string) error { return RedisAcquireRelease(ctx, c, key) },
		RoundTrip:      func(ctx context.Context) error { return c.Ping(ctx).Err() },
		close:          []func() error{c.Close},
	}, nil
}

// RedlockNodes turns a redlock:// URL into one redis:// URL per node (the
// URL's user, password and path kept; its query dropped).
func RedlockNodes(u *url.URL) ([]string, error) {
	if u.Host == "" {
		return nil, errors.New("no hosts")
	}
	var out []string
	for _, h := range strings.Split(u.Host, ",") {
		n := url.URL{Scheme: "redis", User: u.User, Host: h, Path: u.Path}
		out = append(out, n.String())
	}
	return out, nil
}

func redlockFloor(ctx context.Context, u *url.URL) (*Floor, error) {
	nodes, err := RedlockNodes(u)
	if err != nil {
		return nil, err
	}
	f := &Floor{Desc: "SET NX PX + scripted delete on every node in parallel"}
	var cs []*redis.Client
	for _, n := range nodes {
		c, err := redisClient(ctx, n)
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		cs = append(cs, c)
		f.close = append(f.close, c.Close)
	}
	each := func(do func(c *redis.Client) error) error {
		errs := make([]error, len(cs))
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() { errs[i] = do(c) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	f.AcquireRelease = func(ctx context.Context, key string) error {
		return each(func(c *redis.Client) error { return RedisAcquireRelease(ctx, c, key) })
	}
	f.RoundTrip = func(ctx context.Context) error {
		return each(func(c *redis.Client) error { return c.Ping(ctx).Err() })
	}
	return f, nil
}

// EtcdConfig is the clientv3 configuration for an etcd:// URL.
func EtcdConfig(u *url.URL) clientv3.Config {
	cfg := clientv3.Config{DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	for _, h := range strings.Split(u.Host, ",") {
		if !strings.Contains(h, ":") {
			h += ":2379"
		}
		cfg.Endpoints = append(cfg.Endpoints, h)
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	return cfg
}

func etcdFloor(ctx context.Context, u *url.URL) (*Floor, error) {
	cli, err := clientv3.New(EtcdConfig(u))
	if err != nil {
		return nil, err
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &Floor{
		Desc: "put-if-absent Txn + Delete",
		AcquireRelease: func(ctx context.Context, key string) error {
			key = "\x00dlock-floor/" + key
			resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, "x", clientv3.WithLease(lease.ID))).Commit()
			if err != nil {
				return err
			}
			if !resp.Succeeded {
				return errors.New("key held")
			}
			_, err = cli.Delete(ctx, key)
			return err
		},
		RoundTrip: func(ctx context.Context) error {
			_, err := cli.Put(ctx, "\x00dlock-floor-rtt", "x")
			return err
		},
		close: []func() error{func() error {
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, _ = cli.Revoke(rctx, lease.ID)
			return cli.Close()
		}},
	}, nil
}

// ZKConnect connects to the hosts of a zk:// URL and waits for a session.
func ZKConnect(ctx context.Context, u *url.URL) (*zk.Conn, error) {
	var hosts []string
	for _, h := range strings.Split(u.Host, ",") {
		if !strings.Contains(h, ":") {
			h += ":2181"
		}
		hosts = append(hosts, h)
	}
	conn, events, err := zk.Connect(hosts, 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				if u.User != nil {
					pw, _ := u.User.Password()
					if err := conn.AddAuth("digest", []byte(u.User.Username()+":"+pw)); err != nil {
						conn.Close()
						return nil, err
					}
				}
				go func() {
					for range events { // drain until the connection closes
					}
				}()
				return conn, nil
			}
		case <-t.C:
			conn.Close()
			return nil, errors.New("no session within 10s")
		case <-ctx.Done():
			conn.Close()
			return nil, ctx.Err()
		}
	}
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

func zkFloor(ctx context.Context, u *url.URL) (*Floor, error) {
	conn, err := ZKConnect(ctx, u)
	if err != nil {
		return nil, err
	}
	parent := "/dlock-floor"
	if _, err := conn.Create(parent, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		conn.Close()
		return nil, err
	}
	rtt := "/dlock-floor-rtt"
	if _, err := conn.Create(rtt, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		conn.Close()
		return nil, err
	}
	return &Floor{
		Desc: "create ephemeral node + delete",
		AcquireRelease: func(ctx context.Context, key string) error {
			p := parent + "/" + strings.ReplaceAll(key, "/", "_")
			if _, err := conn.Create(p, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
				return err
			}
			return conn.Delete(p, -1)
		},
		RoundTrip: func(ctx context.Context) error {
			_, err := conn.Set(rtt, []byte("x"), -1)
			return err
		},
		close: []func() error{func() error { conn.Close(); return nil }},
	}, nil
}

// splitMode takes the dlock driver parameters mode and table out of u's
// query and returns the mode.
func splitMode(u *url.URL) (string, *url.URL) {
	c := *u
	q := c.Query()
	mode := q.Get("mode")
	q.Del("mode")
	q.Del("table")
	c.RawQuery = q.Encode()
	return mode, &c
}

// PGConnString is u (a postgres:// URL) without dlock's own parameters and
// pgxpool's (pool_*), for one pgx connection, and the mode it names.
func PGConnString(u *url.URL) (connString, mode string) {
	mode, c := splitMode(u)
	q := c.Query()
	for k := range q {
		if strings.HasPrefix(k, "pool_") {
			q.Del(k)
		}
	}
	c.RawQuery = q.Encode()
	return c.String(), mode
}

func pgFloor(ctx context.Context, u *url.URL) (*Floor, error) {
	cs, mode := PGConnString(u)
	c, err := pgx.Connect(ctx, cs)
	if err != nil {
		return nil, err
	}
	f := &Floor{
		RoundTrip: func(ctx context.Context) error {
			_, err := c.Exec(ctx, "SELECT 1")
			return err
		},
		close: []func() error{func() error { return c.Close(context.Background()) }},
	}
	if mode == "advisory" {
		f.Desc = "pg_try_advisory_lock + pg_advisory_unlock"
		f.AcquireRelease = func(ctx context.Context, key string) error {
			var ok bool
			if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, key).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return errors.New("key held")
			}
			return c.QueryRow(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key).Scan(&ok)
		}
		return f, nil
	}
	if _, err := c.Exec(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor (name text PRIMARY KEY, owner text, until timestamptz)`); err != nil {
		_ = f.Close()
		return nil, err
	}
	f.Desc = "upsert of a lease row + update freeing it"
	f.AcquireRelease = func(ctx context.Context, key string) error {
		tag, err := c.Exec(ctx, `INSERT INTO dlock_floor VALUES ($1, 'x', now() + interval '30 seconds')
			ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, until = excluded.until WHERE dlock_floor.until <= now()`, key)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errors.New("key held")
		}
		_, err = c.Exec(ctx, `UPDATE dlock_floor SET until = now() WHERE name = $1 AND owner = 'x'`, key)
		return err
	}
	return f, nil
}

// MySQLDSN is the go-sql-driver DSN of u (a mysql:// URL) without dlock's
// own parameters, and the mode it names.
func MySQLDSN(u *url.URL) (dsn, mode string) {
	mode, c := splitMode(u)
	cfg := mysql.NewConfig()
	if c.User != nil {
		cfg.User = c.User.Username()
		cfg.Passwd, _ = c.User.Password()
	}
	cfg.Net = "tcp"
	cfg.Addr = c.Host
	if !strings.Contains(cfg.Addr, ":") {
		cfg.Addr += ":3306"
	}
	cfg.DBName = strings.TrimPrefix(c.Path, "/")
	dsn = cfg.FormatDSN()
	if c.RawQuery != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + c.RawQuery
	}
	return dsn, mode
}

func mysqlFloor(ctx context.Context, u *url.URL) (*Floor, error) {
	dsn, mode := MySQLDSN(u)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	f := &Floor{
		RoundTrip: func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, "DO 1")
			return err
		},
		close: []func() error{db.Close},
	}
	if err := db.PingContext(ctx); err != nil {
		_ = f.Close()
		return nil, err
	}
	if mode == "getlock" {
		f.Desc = "GET_LOCK(name, 0) + RELEASE_LOCK"
		f.AcquireRelease = func(ctx context.Context, key string) error {
			var ok sql.NullInt64
			if err := db.QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, key).Scan(&ok); err != nil {
				return err
			}
			if ok.Int64 != 1 {
				return errors.New("key held")
			}
			return db.QueryRowContext(ctx, `SELECT RELEASE_LOCK(?)`, key).Scan(&ok)
		}
		return f, nil
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor (name VARBINARY(255) PRIMARY KEY, owner VARCHAR(64), until DATETIME(6))`); err != nil {
		_ = f.Close()
		return nil, err
	}
	f.Desc = "upsert of a lease row + update freeing it"
	f.AcquireRelease = func(ctx context.Context, key string) error {
		if _, err := db.ExecContext(ctx, `INSERT INTO dlock_floor VALUES (?, 'x', NOW(6) + INTERVAL 30 SECOND)
			ON DUPLICATE KEY UPDATE owner = IF(until <= NOW(6), VALUES(owner), owner), until = IF(until <= NOW(6), VALUES(until), until)`, key); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, `UPDATE dlock_floor SET until = NOW(6) WHERE name = ? AND owner = 'x'`, key)
		return err
	}
	return f, nil
}
