package quorum_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
	"github.com/dlock/dlock/quorum"

	_ "github.com/dlock/dlock/memlock"
	_ "github.com/dlock/dlock/pglock"
	"github.com/dlock/dlock/redislock"
	_ "github.com/dlock/dlock/sqlitelock"
)

// testNodeTimeout is longer than the default for the 1s test TTL (100ms):
// two cores shared with other test processes, under -race, miss 100ms now
// and then (SQLite most of all).
const testNodeTimeout = 400 * time.Millisecond

// testNode is one backend of a quorum under test: its dlock URL, the real
// server behind it (nil for a file), and how to make it forget a grant.
type testNode struct {
	kind string
	url  string
	srv  *testserver.Server
	drop func(ctx context.Context, name string) error
}

// redisNodes starts n independent redis-servers (no persistence: a
// restarted one comes back empty).
func redisNodes(t testing.TB, n int) []*testNode {
	t.Helper()
	var out []*testNode
	for _, s := range testserver.RedisN(t, n, nil) {
		opt, err := redis.ParseURL(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		admin := redis.NewClient(opt)
		t.Cleanup(func() { _ = admin.Close() })
		out = append(out, &testNode{kind: "redis", url: s.URL(), srv: s, drop: func(ctx context.Context, name string) error {
			_, err := redisscript.Drop(ctx, admin, redisscript.KeysFor(redislock.DefaultKeyPrefix, name))
			return err
		}})
	}
	return out
}

// sqliteNode is an SQLite file of its own.
func sqliteNode(t testing.TB) *testNode {
	t.Helper()
	path := filepath.Join(t.TempDir(), "locks.db")
	u := "sqlite://" + path
	var db *sql.DB
	return &testNode{kind: "sqlite", url: u, drop: func(ctx context.Context, name string) error {
		if db == nil {
			var err error
			if db, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)"); err != nil {
				return err
			}
			t.Cleanup(func() { _ = db.Close() })
		}
		// As sqlitelock's own harness: the grant expires now, its
		// lock-delay still runs, the fence is untouched.
		_, err := db.ExecContext(ctx, `UPDATE dlock_locks SET
	lock_until = n.now, delay_until = n.now + (delay_until - lock_until)
FROM (SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now) AS n
WHERE name = ?1 AND count > 0 AND lock_until > n.now`, name)
		return err
	}}
}

// pgNode is a PostgreSQL server of its own (lease mode, the default).
func pgNode(t testing.TB) *testNode {
	t.Helper()
	s := testserver.Postgres(t)
	admin, err := pgxpool.New(context.Background(), s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return &testNode{kind: "postgres", url: s.URL(), srv: s, drop: func(ctx context.Context, name string) error {
		_, err := admin.Exec(ctx, `UPDATE dlock_locks SET lock_until = now(), delay_until = now() + (delay_until - lock_until)
			WHERE name = $1 AND count > 0 AND lock_until > now()`, name)
		return err
	}}
}

// quorumURL is the quorum: URL of nodes.
func quorumURL(nodes []*testNode, query string) string {
	var q []string
	for _, n := range nodes {
		q = append(q, "node="+url.QueryEscape(n.url))
	}
	if query != "" {
		q = append(q, query)
	}
	return "quorum:?" + strings.Join(q, "&")
}

// openQuorum opens a quorum driver over nodes whose node drivers can be
// killed (see killable), as a separate process would.
func openQuorum(ctx context.Context, nodes []*testNode) (*quorum.Driver, error) {
	return openQuorumWith(ctx, nodes, testNodeTimeout)
}

func openQuorumWith(ctx context.Context, nodes []*testNode, nodeTimeout time.Duration) (*quorum.Driver, error) {
	var ds []driver.Driver
	for _, n := range nodes {
		d, err := dlock.OpenDriver(ctx, n.url)
		if err != nil {
			for _, d := range ds {
				_ = d.Close()
			}
			return nil, fmt.Errorf("%s node: %w", n.kind, err)
		}
		ds = append(ds, &killable{Driver: d})
	}
	return quorum.New(ds, &quorum.Options{NodeTimeout: nodeTimeout})
}

// harness runs the conformance suite over a quorum of nodes.
type harness struct {
	nodes       []*testNode
	ttl         time.Duration
	nodeTimeout time.Duration
}

func newHarness(nodes func(t testing.TB) []*testNode) locktest.NewHarness {
	return func(ctx context.Context, t testing.TB) (locktest.Harness, error) {
		h := &harness{nodes: nodes(t), ttl: time.Second, nodeTimeout: testNodeTimeout}
		for _, n := range h.nodes {
			if n.kind == "sqlite" && raceEnabled {
				// Under -race SQLite is some 30 times slower (see
				// sqlitelock's harness): one statement can take most of
				// a second on a loaded machine.
				h.ttl, h.nodeTimeout = 2*time.Second, 600*time.Millisecond
			}
		}
		return h, nil
	}
}

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	return openQuorumWith(ctx, h.nodes, h.nodeTimeout)
}

// Kill cuts every node driver off at once: no call reaches a node again,
// nothing is released, and the grants expire on the nodes.
func (h *harness) Kill(d driver.Driver) error {
	qd, ok := d.(*quorum.Driver)
	if !ok {
		return fmt.Errorf("not a quorum driver: %T", d)
	}
	for _, n := range qd.Nodes() {
		n.(*killable).kill()
	}
	return nil
}

// Drop makes every node forget the grant.
func (h *harness) Drop(ctx context.Context, name string) error {
	for _, n := range h.nodes {
		if err := n.drop(ctx, name); err != nil {
			return fmt.Errorf("%s node: %w", n.kind, err)
		}
	}
	return nil
}

func (h *harness) Config() locktest.Config {
	return locktest.Config{TTL: h.ttl, LockDelay: true, Clients: 3}
}

func (h *harness) Close() {}

// errKilled is what a killed node driver answers.
var errKilled = errors.New("killed (test)")

// killable is a node driver that a test can cut off at once, as a crashed
// process is: after kill, every call fails without reaching the backend,
// so nothing is released and the backend learns of the loss by expiry.
// Close still closes the driver (it then releases what it booked, after
// the test has seen the expiry). It passes the node's optional
// capabilities through.
type killable struct {
	driver.Driver
	killed atomic.Bool
}

func (k *killable) kill() { k.killed.Store(true) }

func (k *killable) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if k.killed.Load() {
		return driver.Grant{}, errKilled
	}
	return k.Driver.TryAcquire(ctx, req)
}

func (k *killable) Release(ctx context.Context, l driver.Lease) (int, error) {
	if k.killed.Load() {
		return 0, errKilled
	}
	return k.Driver.Release(ctx, l)
}

func (k *killable) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if k.killed.Load() {
		return nil, errKilled
	}
	return k.Driver.Renew(ctx, ls)
}

func (k *killable) RaiseFence(ctx context.Context, name string, kind driver.Kind, atLeast uint64) error {
	if k.killed.Load() {
		return errKilled
	}
	return k.Driver.(driver.FenceRaiser).RaiseFence(ctx, name, kind, atLeast)
}

func (k *killable) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	n, ok := k.Driver.(driver.Notifier)
	if !ok {
		return nil, errors.New("node does not notify")
	}
	return n.Subscribe(ctx, name)
}

func (k *killable) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	in, ok := k.Driver.(driver.Inspector)
	if !ok {
		return nil, driver.ErrUnsupported
	}
	if k.killed.Load() {
		return nil, errKilled
	}
	return in.Inspect(ctx, prefix)
}

func (k *killable) Limits() driver.Limits {
	if l, ok := k.Driver.(driver.Limiter); ok {
		return l.Limits()
	}
	return driver.Limits{}
}

func (k *killable) CheckName(name string) error {
	if c, ok := k.Driver.(driver.NameChecker); ok {
		return c.CheckName(name)
	}
	return nil
}
