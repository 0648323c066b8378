package pglock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

func TestMain(m *testing.M) { sqltest.Main(m, server) }

// harness runs the conformance suite against one mode. Every driver it
// makes opens its own pool from a URL, like a separate process would.
type harness struct {
	base  string // server URL without our parameters
	mode  Mode
	table string
	admin *pgxpool.Pool

	drivers sqltest.Drivers[*Driver]
}

func adminFor(ctx context.Context, u string) (*pgxpool.Pool, error) { return pgxpool.New(ctx, u) }

func newHarnessFor(mode Mode) locktest.NewHarness {
	return func(ctx context.Context, t testing.TB) (locktest.Harness, error) {
		base := serverURL(t)
		admin, err := pgxpool.New(ctx, base)
		if err != nil {
			return nil, err
		}
		return &harness{base: base, mode: mode, table: "dlock_test_" + string(mode), admin: admin}, nil
	}
}

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	d, err := OpenURL(ctx, sqltest.ModeURL(h.base, string(h.mode), h.table))
	if err != nil {
		return nil, err
	}
	h.drivers.Add(d.(*Driver))
	return d, nil
}

func (h *harness) Kill(d driver.Driver) error {
	d.(*Driver).kill()
	return nil
}

// Drop makes the server forget name's grant: in ModeLease the row's
// lock_until moves to now (the lock-delay still runs from there); in the
// session modes the holder's backend is terminated from this connection,
// as an operator would.
func (h *harness) Drop(ctx context.Context, name string) error {
	if h.mode == ModeLease {
		_, err := h.admin.Exec(ctx, `UPDATE `+h.table+` SET lock_until = now(), delay_until = now() + (delay_until - lock_until)
			WHERE name = $1 AND count > 0 AND lock_until > now()`, name)
		return err
	}
	var pid uint32
	for _, d := range h.drivers.All() {
		if p, ok := d.holderPID(name); ok {
			pid = p
		}
	}
	if pid == 0 {
		return fmt.Errorf("no holder of %q among this harness's drivers", name)
	}
	return terminate(ctx, h.admin, pid)
}

func terminate(ctx context.Context, admin *pgxpool.Pool, pid uint32) error {
	var ok bool
	if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pg_terminate_backend(%d) found no such backend", pid)
	}
	return nil
}

// DropKind forgets the current grants of kind k on name with no
// lock-delay: a mutex's lease ends now (a session-mode holder's backend
// is terminated, as Drop does); readers', a writer's or permits' rows are
// deleted. Counters and stored permit counts stay.
func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	if h.mode != ModeLease {
		if k == driver.Exclusive {
			return h.Drop(ctx, name)
		}
		for _, d := range h.drivers.All() {
			for _, pid := range d.holderPIDs(name, k) {
				if err := terminate(ctx, h.admin, pid); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if k == driver.Exclusive {
		_, err := h.admin.Exec(ctx, `UPDATE `+h.table+` SET lock_until = now(), delay_until = now()
			WHERE name = $1 AND count > 0 AND lock_until > now()`, name)
		return err
	}
	_, err := h.admin.Exec(ctx, `DELETE FROM `+h.table+`_holders WHERE name = $1 AND grp = $2 AND kind = $3`,
		name, sqlcommon.Group(k), sqlcommon.HolderKind(k))
	return err
}

func (h *harness) Config() locktest.Config {
	if h.mode == ModeLease {
		return locktest.Config{TTL: time.Second, LockDelay: true}
	}
	// One pinned connection per held lock: the Renew benchmark holds what
	// the pool (32 connections from a URL) allows, leaving room for waiters.
	return locktest.Config{TTL: time.Second, SessionBound: true, RenewLeases: 16}
}

func (h *harness) Close() { h.admin.Close() }

// AcquireReleaseFloor is the bare primitive of the mode on one connection:
// lease: an upsert and an update of one row; advisory: pg_try_advisory_lock
// and pg_advisory_unlock; rowlock: BEGIN + SELECT … FOR UPDATE NOWAIT
// pipelined, then COMMIT.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	c, err := h.admin.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	var op func(context.Context, string) error
	switch h.mode {
	case ModeLease:
		_, err = c.Exec(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor (name text PRIMARY KEY, owner text, until timestamptz)`)
		op = func(ctx context.Context, key string) error {
			if _, err := c.Exec(ctx, `INSERT INTO dlock_floor VALUES ($1, 'x', now() + interval '30 seconds')
				ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, until = excluded.until WHERE dlock_floor.until <= now()`, key); err != nil {
				return err
			}
			_, err := c.Exec(ctx, `UPDATE dlock_floor SET until = now() WHERE name = $1 AND owner = 'x'`, key)
			return err
		}
	case ModeAdvisory:
		op = func(ctx context.Context, key string) error {
			k := AdvisoryKey(key)
			var ok bool
			if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, k).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("floor lock: %v %v", ok, err)
			}
			return c.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, k).Scan(&ok)
		}
	case ModeRowLock:
		_, err = c.Exec(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor_rows (name text PRIMARY KEY)`)
		op = func(ctx context.Context, key string) error {
			if _, err := c.Exec(ctx, `INSERT INTO dlock_floor_rows VALUES ($1) ON CONFLICT DO NOTHING`, key); err != nil {
				return err
			}
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			b.Queue(`SELECT 1 FROM dlock_floor_rows WHERE name = $1 FOR UPDATE NOWAIT`, key)
			if err := c.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			_, err := c.Exec(ctx, "COMMIT")
			return err
		}
	}
	if err != nil {
		c.Release()
		return nil, nil, err
	}
	return op, c.Release, nil
}

// RoundTripFloor is SELECT 1 on one connection.
func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	c, err := h.admin.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context) error {
		_, err := c.Exec(ctx, "SELECT 1")
		return err
	}, c.Release, nil
}

func TestConformanceLease(t *testing.T) {
	locktest.RunConformanceTests(t, newHarnessFor(ModeLease))
}

func TestConformanceAdvisory(t *testing.T) {
	locktest.RunConformanceTests(t, newHarnessFor(ModeAdvisory))
}

func TestConformanceRowLock(t *testing.T) {
	locktest.RunConformanceTests(t, newHarnessFor(ModeRowLock))
}

func BenchmarkLease(b *testing.B)    { locktest.RunBenchmarks(b, newHarnessFor(ModeLease)) }
func BenchmarkAdvisory(b *testing.B) { locktest.RunBenchmarks(b, newHarnessFor(ModeAdvisory)) }
func BenchmarkRowLock(b *testing.B)  { locktest.RunBenchmarks(b, newHarnessFor(ModeRowLock)) }

func randomName(prefix string) string { return sqltest.RandomName(prefix) }

// TestExternalKill terminates a session-mode holder's backend from another
// connection: the holder's Done closes within a bounded time, and a waiter
// then gets the lock with a larger token.
func TestExternalKill(t *testing.T) {
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			h := newTestHarness(t, mode)
			sqltest.ExternalKill(t, h.NewDriver, func(ctx context.Context, holder driver.Driver, name string) error {
				pid, ok := holder.(*Driver).holderPID(name)
				if !ok {
					return errors.New("holder has no pinned connection")
				}
				return terminate(ctx, h.admin, pid)
			}, "pg_terminate_backend")
		})
	}
}

// newTestHarness returns a harness for mode, closed when t ends.
// openDriver opens a driver of h, closed at the end of t.
func (h *harness) openDriver(t testing.TB) *Driver {
	t.Helper()
	dn, err := h.NewDriver(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dn.Close() })
	return dn.(*Driver)
}

func newTestHarness(t testing.TB, mode Mode) *harness {
	t.Helper()
	hn, err := newHarnessFor(mode)(context.Background(), t)
	if err != nil {
		t.Fatal(err)
	}
	h := hn.(*harness)
	t.Cleanup(h.Close)
	return h
}

func TestURL(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url, want string
		invalid   bool // bad input (wraps driver.ErrInvalid), not a failure to connect
	}{
		{"postgres://u:s3cret@127.0.0.1:1/db?mode=bogus", "unknown mode", true},
		{"postgres://u:s3cret@127.0.0.1:1/db?table=bad-name", "table name", true},
		{"postgres://u:s3cret@127.0.0.1:1/db?mode=", "mode is empty", true},
		{"postgres://u:s3cret@127.0.0.1:1/db?sslmode=nonsense", "sslmode", true},
		{"postgres://u@127.0.0.1:1/db?password=s3cret&sslmode=nonsense", "sslmode", true},
		{"mysql://u:s3cret@127.0.0.1:1/db", "scheme", true},
		{"postgresql://u:s3cret@127.0.0.1:1/db?connect_timeout=1", "connect", false},
		{"postgresql://u@127.0.0.1:1/db?connect_timeout=1&password=s3cret", "connect", false},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		d, err := OpenURL(ctx, u)
		if err == nil {
			_ = d.Close()
			t.Fatalf("%s: opened", tc.url)
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "s3cret") {
			t.Fatalf("%s: error %q: want it to mention %q and not the password", tc.url, msg, tc.want)
		}
		if errors.Is(err, driver.ErrInvalid) != tc.invalid {
			t.Fatalf("%s: error %q: wraps ErrInvalid %v, want %v", tc.url, err, !tc.invalid, tc.invalid)
		}
	}
	// Options map one-to-one onto the URL.
	u, _ := url.Parse(serverURL(t) + "&mode=advisory&table=dlock_url_test")
	d, err := OpenURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if pd := d.(*Driver); pd.Mode() != ModeAdvisory || pd.table != "dlock_url_test" {
		t.Fatalf("mode %q table %q", pd.Mode(), pd.table)
	}
}

// TestNewKeepsUserPool checks that Close leaves a pool passed to New open.
func TestNewKeepsUserPool(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := New(nil, nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := New(pool, &Options{Table: "x;drop"}); err == nil {
		t.Fatal("bad table accepted")
	}
	d, err := New(pool, &Options{Mode: ModeAdvisory})
	if err != nil {
		t.Fatal(err)
	}
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: randomName("keep"), Owner: "o", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token == 0 {
		t.Fatal("token 0")
	}
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "x", Owner: "o", TTL: time.Second, LockDelay: time.Second}); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("lock-delay in advisory mode: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("user's pool closed by Close: %v", err)
	}
}

// TestWaiterConnections measures what 100 goroutines waiting on one held
// lock through one driver cost in connections: none is pinned (only holders
// pin), the pool opens a few for the polls, and the driver keeps one LISTEN
// connection outside the pool.
func TestWaiterConnections(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			h := newTestHarness(t, mode)
			stats := func(d driver.Driver) (int, int) {
				st := d.(*Driver).pool.Stat()
				return int(st.TotalConns()), int(st.AcquiredConns())
			}
			pinned := func(d driver.Driver) int { return d.(*Driver).sess.Len() }
			peakOpen, peakBusy, avgBusy := sqltest.WaiterConnections(t, h.NewDriver, stats, pinned)
			t.Logf("mode %s: 100 waiters on one driver: pool connections open at peak %d, in use at peak %d, in use on average after the first 0.5s %.1f, pinned 0, plus 1 LISTEN connection",
				mode, peakOpen, peakBusy, avgBusy)
		})
	}
}

// TestRenewBatch renews several leases in one call, some of them stale: only
// the exact grants (name, owner and token) are renewed.
func TestRenewBatch(t *testing.T) {
	d, err := newTestHarness(t, ModeLease).NewDriver(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sqltest.RenewBatch(t, d)
}

// TestListenerReconnect terminates the driver's LISTEN connection: every
// subscriber is woken (a release may have been missed), the listener comes
// back on its own, and later releases are delivered again.
func TestListenerReconnect(t *testing.T) {
	ctx := context.Background()
	hn, err := newHarnessFor(ModeLease)(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	h := hn.(*harness)
	defer h.Close()
	dw, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer dw.Close()
	dh, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer dh.Close()
	name := randomName("listen")
	sub, err := dw.(*Driver).Subscribe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	other, err := dw.(*Driver).Subscribe(ctx, name+"-other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ln := dw.(*Driver).ln
	listenerPID := func() uint32 {
		ln.mu.Lock()
		defer ln.mu.Unlock()
		return ln.pid
	}
	first := listenerPID()
	for up := time.Now().Add(5 * time.Second); first == 0; first = listenerPID() {
		if time.Now().After(up) {
			t.Fatal("listener not up after Subscribe")
		}
		tick := time.NewTimer(time.Millisecond)
		<-tick.C
	}
	if err := terminate(ctx, h.admin, first); err != nil {
		t.Fatal(err)
	}
	for _, s := range []driver.Subscription{sub, other} {
		select {
		case <-s.C():
		case <-time.After(5 * time.Second):
			t.Fatal("subscriber not woken when the LISTEN connection died")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for p := listenerPID(); p == 0 || p == first; p = listenerPID() {
		if time.Now().After(deadline) {
			t.Fatal("listener did not reconnect")
		}
		tick := time.NewTimer(10 * time.Millisecond)
		<-tick.C
	}
	// Drain the wake the reconnect itself sent (before it published its PID).
	for _, s := range []driver.Subscription{sub, other} {
		select {
		case <-s.C():
		default:
		}
	}
	g, err := dh.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dh.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	case <-time.After(5 * time.Second):
		t.Fatal("release not delivered after the listener reconnected")
	}
	select {
	case <-other.C():
		t.Fatal("a release of another name woke a subscriber")
	default:
	}
}

// TestLeaseDriver checks the lease statements at the driver level: re-entry
// counts, the holder's remaining time in LockedError, owner-checked release,
// and a fence that grows by one per grant.
func TestLeaseDriver(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	name := randomName("leasedrv")
	req := driver.AcquireRequest{Name: name, Owner: "o1", TTL: 10 * time.Second}
	g1, err := d.TryAcquire(ctx, req)
	if err != nil || g1.Count != 1 {
		t.Fatalf("first acquire %+v %v", g1, err)
	}
	g2, err := d.TryAcquire(ctx, req)
	if err != nil || g2.Count != 2 || g2.Token != g1.Token {
		t.Fatalf("re-entry %+v %v", g2, err)
	}
	var le *driver.LockedError
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o2", TTL: time.Second}); !errors.As(err, &le) || le.RetryAfter <= 8*time.Second || le.Token != g1.Token {
		t.Fatalf("other owner got %v (%+v), want LockedError with RetryAfter near 10s and the holder's token", err, le)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o2", Token: g1.Token}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release by another owner: %v", err)
	}
	for want := 1; want >= 0; want-- {
		n, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o1", Token: g1.Token})
		if err != nil || n != want {
			t.Fatalf("release = %d, %v; want %d", n, err, want)
		}
	}
	g3, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o2", TTL: time.Second})
	if err != nil || g3.Token != g1.Token+1 {
		t.Fatalf("acquire after release %+v %v", g3, err)
	}
}

// TestServerCrashRestart kills the server (SIGKILL) and starts it again on
// the same port: a session-mode holder's Done closes; lease rows (which a
// short restart leaves held) and fence counters survive, so every grant
// after the restart has a larger token.
func TestServerCrashRestart(t *testing.T) {
	srv := server.Private(t)
	if srv == nil {
		t.Skip("external server: cannot restart it")
	}
	for _, mode := range []Mode{ModeLease, ModeAdvisory} {
		t.Run(string(mode), func(t *testing.T) {
			sqltest.CrashRestart(t, srv, newTestHarness(t, mode).NewDriver, mode != ModeLease)
		})
	}
}

// TestRowLockFullPool holds locks until the pool has no connection left for
// the fence increment: TryAcquire fails with an error saying so, within a
// bounded time, and leaves nothing locked behind.
func TestRowLockFullPool(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, serverURL(t)+"&pool_max_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(pool, &Options{Mode: ModeRowLock, Table: "dlock_test_rowlock"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	base := randomName("fullpool")
	g1, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: base + "-1", Owner: "o", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = d.TryAcquire(ctx, driver.AcquireRequest{Name: base + "-2", Owner: "o", TTL: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "no free connection") {
		t.Fatalf("second lock on a 2-connection pool: %v, want an error about the full pool", err)
	}
	t.Logf("full pool: %v", err)
	if took := time.Since(start); took > pinTimeout+2*time.Second {
		t.Fatalf("failing took %v", took)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: base + "-1", Owner: "o", Token: g1.Token, Handle: g1.Handle}); err != nil {
		t.Fatal(err)
	}
	g2, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: base + "-2", Owner: "o", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("the failed attempt left the name locked: %v", err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: base + "-2", Owner: "o", Token: g2.Token, Handle: g2.Handle}); err != nil {
		t.Fatal(err)
	}
}

// TestPre14Statements runs advisory mode's statements for servers without
// idle_session_timeout (PostgreSQL 12 and 13) by making the driver believe
// the server is 13.
func TestPre14Statements(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(pool, &Options{Mode: ModeAdvisory})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.base.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	d.pgVer = 130000
	name := randomName("pg13")
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := driver.Lease{Name: name, Owner: "o", Token: g.Token, Handle: g.Handle, TTL: time.Second}
	if errs, err := d.Renew(ctx, []driver.Lease{l}); err != nil || errs[0] != nil {
		t.Fatalf("renew: %v %v", err, errs)
	}
	if _, err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestServerClockDecidesExpiry jumps the server's wall clock forward past a
// lease's TTL: the server, not the client, decides expiry, so another
// client can take the lock at once (with a larger token), and the old
// holder's next renewal learns that its lease is gone.
func TestServerClockDecidesExpiry(t *testing.T) {
	s := testserver.PostgresWith(t, &testserver.SQLOptions{Faketime: true})
	h := &harness{base: s.URL(), mode: ModeLease, table: "dlock_test_clock"}
	var err error
	h.admin, err = adminFor(context.Background(), s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	sqltest.ClockDecidesExpiry(t, s, h.NewDriver)
}

// TestSessionDiesAtGrant terminates the holder's backend while its grant
// is being made, and has another driver take the lock before the grant
// returns (see sqltest.DiesAtGrant). In ModeRowLock the kill lands between
// the row lock and the fence increment (on a second connection), where it
// used to let the dead session return a token larger than the live later
// holder's; in ModeAdvisory the lock and the increment are one statement,
// so the kill lands after both.
func TestSessionDiesAtGrant(t *testing.T) {
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			h := newTestHarness(t, mode)
			ctx := context.Background()
			a, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			arm := func(hook sqltest.Hook) {
				a.(*Driver).testHookLocked = func(ctx context.Context, c *pinned) {
					hook(ctx, func(ctx context.Context) error { return terminate(ctx, h.admin, c.pid) })
				}
			}
			sqltest.DiesAtGrant(t, a, b, arm, mode == ModeRowLock)
		})
	}
}

// TestServerDown kills the server under drivers of every mode: TryAcquire
// fails at once with the real cause (connection refused), not as a full
// pool, as the session modes used to report every pool error.
func TestServerDown(t *testing.T) {
	srv := server.Private(t)
	if srv == nil {
		t.Skip("external server: cannot kill it")
	}
	ds := map[string]driver.Driver{}
	for _, mode := range []Mode{ModeLease, ModeAdvisory, ModeRowLock} {
		d, err := newTestHarness(t, mode).NewDriver(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds[string(mode)] = d
	}
	u, _ := url.Parse(srv.URL())
	pw, _ := u.User.Password()
	sqltest.ServerDown(t, srv, ds, func(d driver.Driver) { d.(*Driver).pool.Reset() }, pw)
}

// TestPausedHolder: a session-mode holder that stops renewing past its TTL
// (the checker's pause-holder fault) loses its hold in the driver too, so
// a waiter on the same driver gets the lock once the server has ended the
// paused session (see sqltest.PausedHolder).
func TestPausedHolder(t *testing.T) {
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			h := newTestHarness(t, mode)
			sqltest.PausedHolder(t, h.NewDriver, func(d driver.Driver) int { return d.(*Driver).sess.Len() })
		})
	}
}
