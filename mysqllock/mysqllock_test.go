package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

func TestMain(m *testing.M) {
	// The tests kill connections on purpose; go-sql-driver logs each one.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	sqltest.Main(m, server)
}

// harness runs the conformance suite against one mode. Every driver it
// makes opens its own *sql.DB from a URL, like a separate process would.
type harness struct {
	base  string
	mode  Mode
	table string
	admin *sql.DB

	drivers sqltest.Drivers[*Driver]
}

func openAdmin(t testing.TB) (*sql.DB, error) { return adminFor(context.Background(), serverURL(t)) }

func adminFor(_ context.Context, raw string) (*sql.DB, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	_, dsn, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return sql.Open("mysql", dsn)
}

func newHarnessFor(mode Mode) locktest.NewHarness {
	return func(ctx context.Context, t testing.TB) (locktest.Harness, error) {
		admin, err := openAdmin(t)
		if err != nil {
			return nil, err
		}
		return &harness{base: serverURL(t), mode: mode, table: "dlock_test_" + string(mode), admin: admin}, nil
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
// session modes the holder's connection is KILLed from this one, as an
// operator would.
func (h *harness) Drop(ctx context.Context, name string) error {
	if h.mode == ModeLease {
		_, err := h.admin.ExecContext(ctx, `UPDATE `+h.table+` SET delay_until = UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, lock_until, delay_until) MICROSECOND,
			lock_until = UTC_TIMESTAMP(6) WHERE name = ? AND `+"`count`"+` > 0 AND lock_until > UTC_TIMESTAMP(6)`, []byte(name))
		return err
	}
	for _, d := range h.drivers.All() {
		if id, ok := d.holderConnID(ctx, name); ok {
			_, err := h.admin.ExecContext(ctx, fmt.Sprintf("KILL %d", id))
			return err
		}
	}
	return fmt.Errorf("no holder of %q among this harness's drivers", name)
}

// DropKind forgets the current grants of kind k on name with no
// lock-delay: a mutex's lease ends now (a session-mode holder's
// connection is KILLed, as Drop does); readers', a writer's or permits'
// rows are deleted. Counters and stored permit counts stay.
func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	if k == driver.Exclusive {
		if h.mode != ModeLease {
			return h.Drop(ctx, name)
		}
		_, err := h.admin.ExecContext(ctx, `UPDATE `+h.table+` SET lock_until = UTC_TIMESTAMP(6), delay_until = UTC_TIMESTAMP(6)
			WHERE name = ? AND `+"`count`"+` > 0 AND lock_until > UTC_TIMESTAMP(6)`, []byte(name))
		return err
	}
	_, err := h.admin.ExecContext(ctx, `DELETE FROM `+h.table+`_holders WHERE name = ? AND grp = ? AND kind = ?`,
		[]byte(name), sqlcommon.Group(k), sqlcommon.HolderKind(k))
	return err
}

func (h *harness) Config() locktest.Config {
	if h.mode == ModeLease {
		return locktest.Config{TTL: time.Second, LockDelay: true}
	}
	// wait_timeout has whole-second resolution: the TTL the suite waits
	// out must be at least that.
	// One pinned connection per held lock: the Renew benchmark holds what
	// the pool (32 connections from a URL) allows, leaving room for waiters.
	return locktest.Config{TTL: time.Second, SessionBound: true, RenewLeases: 16}
}

func (h *harness) Close() { _ = h.admin.Close() }

// AcquireReleaseFloor is the bare primitive of the mode on one connection,
// as literal SQL text like the driver sends: lease: an upsert and an update
// of one row; getlock: GET_LOCK and RELEASE_LOCK; rowlock: START
// TRANSACTION, SELECT … FOR UPDATE NOWAIT, COMMIT.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	c, err := h.admin.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	var op func(context.Context, string) error
	switch h.mode {
	case ModeLease:
		_, err = c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor (name VARBINARY(255) PRIMARY KEY, owner VARBINARY(128), until DATETIME(6))`)
		op = func(ctx context.Context, key string) error {
			k := hexLit(key)
			if _, err := c.ExecContext(ctx, `INSERT INTO dlock_floor VALUES (`+k+`, 'x', UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)
				ON DUPLICATE KEY UPDATE owner = IF(until <= UTC_TIMESTAMP(6), 'x', owner), until = IF(until <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, until)`); err != nil {
				return err
			}
			_, err := c.ExecContext(ctx, `UPDATE dlock_floor SET until = UTC_TIMESTAMP(6) WHERE name = `+k+` AND owner = 'x'`)
			return err
		}
	case ModeGetLock:
		op = func(ctx context.Context, key string) error {
			l := hexLit(LockName(key))
			var ok int
			if err := c.QueryRowContext(ctx, `SELECT GET_LOCK(`+l+`, 0)`).Scan(&ok); err != nil || ok != 1 {
				return fmt.Errorf("floor lock: %v %v", ok, err)
			}
			return c.QueryRowContext(ctx, `SELECT RELEASE_LOCK(`+l+`)`).Scan(&ok)
		}
	case ModeRowLock:
		_, err = c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor_rows (name VARBINARY(255) PRIMARY KEY)`)
		op = func(ctx context.Context, key string) error {
			k := hexLit(key)
			if _, err := c.ExecContext(ctx, `INSERT IGNORE INTO dlock_floor_rows VALUES (`+k+`)`); err != nil {
				return err
			}
			if _, err := c.ExecContext(ctx, "START TRANSACTION"); err != nil {
				return err
			}
			var one int
			if err := c.QueryRowContext(ctx, `SELECT 1 FROM dlock_floor_rows WHERE name = `+k+` FOR UPDATE NOWAIT`).Scan(&one); err != nil {
				return err
			}
			_, err := c.ExecContext(ctx, "COMMIT")
			return err
		}
	}
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return op, func() { _ = c.Close() }, nil
}

// RoundTripFloor is SELECT 1 on one connection.
func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	c, err := h.admin.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context) error {
		var one int
		return c.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	}, func() { _ = c.Close() }, nil
}

func TestConformanceLease(t *testing.T) {
	locktest.RunConformanceTests(t, newHarnessFor(ModeLease))
}

func TestConformanceGetLock(t *testing.T) {
	locktest.RunConformanceTests(t, newHarnessFor(ModeGetLock))
}

func TestConformanceRowLock(t *testing.T) {
	locktest.RunConformanceTests(t, newHarnessFor(ModeRowLock))
}

func BenchmarkLease(b *testing.B)   { locktest.RunBenchmarks(b, newHarnessFor(ModeLease)) }
func BenchmarkGetLock(b *testing.B) { locktest.RunBenchmarks(b, newHarnessFor(ModeGetLock)) }
func BenchmarkRowLock(b *testing.B) { locktest.RunBenchmarks(b, newHarnessFor(ModeRowLock)) }

func randomName(prefix string) string { return sqltest.RandomName(prefix) }

// TestExternalKill KILLs a session-mode holder's connection from another
// connection: the holder's Done closes within a bounded time, and a waiter
// then gets the lock with a larger token.
func TestExternalKill(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			h := newTestHarness(t, mode)
			sqltest.ExternalKill(t, h.NewDriver, func(ctx context.Context, holder driver.Driver, name string) error {
				id, ok := holder.(*Driver).holderConnID(ctx, name)
				if !ok {
					return errors.New("holder has no pinned connection")
				}
				_, err := h.admin.ExecContext(ctx, fmt.Sprintf("KILL %d", id))
				return err
			}, "KILL")
		})
	}
}

// newTestHarness returns a harness for mode, closed when t ends.
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
	for _, tc := range []struct {
		url, want string
		invalid   bool // bad input (wraps driver.ErrInvalid), not a failure to connect
	}{
		{"mysql://u:s3cret@127.0.0.1:1/db?mode=bogus", "unknown mode", true},
		{"mysql://u:s3cret@127.0.0.1:1/db?table=bad-name", "table name", true},
		{"mysql://u:s3cret@127.0.0.1:1/db?mode=", "mode is empty", true},
		{"mysql://u:s3cret@127.0.0.1:1/", "no database", true},
		{"mysql://u:s3cret@127.0.0.1:1/db?tls=nonsense", "nonsense", true},
		{"postgres://u:s3cret@127.0.0.1:1/db", "scheme", true},
		{"mysql://u:s3cret@127.0.0.1:1/db?timeout=1s", "connect", false},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := OpenURL(ctx, u)
		cancel()
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
	u, _ := url.Parse("mysql://u:p%40ss@db.example:3307/app?tls=true&mode=getlock&table=t1&timeout=2s")
	o, dsn, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if o.Mode != ModeGetLock || o.Table != "t1" {
		t.Fatalf("options %+v", o)
	}
	if want := "u:p@ss@tcp(db.example:3307)/app?"; !strings.HasPrefix(dsn, want) || !strings.Contains(dsn, "tls=true") || !strings.Contains(dsn, "timeout=2s") || strings.Contains(dsn, "mode=") {
		t.Fatalf("dsn %q", dsn)
	}
}

// TestNewKeepsUserDB checks that Close leaves a *sql.DB passed to New open,
// and that lease acquisition works whatever the DSN says about found rows.
func TestNewKeepsUserDB(t *testing.T) {
	ctx := context.Background()
	u, _ := url.Parse(serverURL(t))
	_, dsn, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	for _, extra := range []string{"", "clientFoundRows=true", "interpolateParams=true"} {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		db, err := sql.Open("mysql", dsn+sep+extra)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(nil, nil); err == nil {
			t.Fatal("New(nil) succeeded")
		}
		if _, err := New(db, &Options{Table: "x;drop"}); err == nil {
			t.Fatal("bad table accepted")
		}
		d, err := New(db, nil)
		if err != nil {
			t.Fatal(err)
		}
		name := randomName("keep")
		req := driver.AcquireRequest{Name: name, Owner: "o1", TTL: 10 * time.Second}
		g1, err := d.TryAcquire(ctx, req)
		if err != nil || g1.Count != 1 {
			t.Fatalf("%s: first acquire %+v %v", extra, g1, err)
		}
		g2, err := d.TryAcquire(ctx, req)
		if err != nil || g2.Count != 2 || g2.Token != g1.Token {
			t.Fatalf("%s: re-entry %+v %v", extra, g2, err)
		}
		var le *driver.LockedError
		if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o2", TTL: time.Second}); !errors.As(err, &le) || le.RetryAfter <= 8*time.Second {
			t.Fatalf("%s: other owner got %v, want LockedError with RetryAfter near 10s", extra, err)
		}
		for want := 1; want >= 0; want-- {
			n, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o1", Token: g1.Token})
			if err != nil || n != want {
				t.Fatalf("%s: release = %d, %v; want %d", extra, n, err, want)
			}
		}
		if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o1", Token: g1.Token}); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("%s: release of a free lock: %v", extra, err)
		}
		g3, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o2", TTL: time.Second})
		if err != nil || g3.Token != g1.Token+1 {
			t.Fatalf("%s: acquire after release %+v %v", extra, g3, err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("user's db closed by Close: %v", err)
		}
		_ = db.Close()
	}
}

func TestLockName(t *testing.T) {
	for _, n := range []string{"a", "orders/42", strings.Repeat("x", 64)} {
		if LockName(n) != n {
			t.Fatalf("LockName(%q) = %q, want it unchanged", n, LockName(n))
		}
	}
	seen := map[string]string{}
	for _, n := range []string{"A", "a", "Orders/42", strings.Repeat("x", 65), "#" + strings.Repeat("0", 63), "ä"} {
		l := LockName(n)
		if len(l) > 64 {
			t.Fatalf("LockName(%q) = %q: longer than 64", n, l)
		}
		if o, dup := seen[strings.ToLower(l)]; dup {
			t.Fatalf("LockName(%q) and LockName(%q) collide (case-insensitively)", n, o)
		}
		seen[strings.ToLower(l)] = n
	}
}

// TestWaiterConnections measures what 100 goroutines waiting on one held
// lock through one driver cost in connections: none is pinned (only holders
// pin); the polls borrow pooled connections for one statement each.
func TestWaiterConnections(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			h := newTestHarness(t, mode)
			stats := func(d driver.Driver) (int, int) {
				st := d.(*Driver).db.Stats()
				return st.OpenConnections, st.InUse
			}
			pinned := func(d driver.Driver) int { return d.(*Driver).sess.Len() }
			peakOpen, peakBusy, avgBusy := sqltest.WaiterConnections(t, h.NewDriver, stats, pinned)
			t.Logf("mode %s: 100 waiters on one driver: connections open at peak %d, in use at peak %d, in use on average after the first 0.5s %.1f, pinned 0",
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

// TestServerCrashRestart kills the server (SIGKILL) and starts it again on
// the same port: a session-mode holder's Done closes; lease rows (which a
// short restart leaves held) and fence counters survive, so every grant
// after the restart has a larger token.
func TestServerCrashRestart(t *testing.T) {
	srv := server.Private(t)
	if srv == nil {
		t.Skip("external server: cannot restart it")
	}
	for _, mode := range []Mode{ModeLease, ModeGetLock} {
		t.Run(string(mode), func(t *testing.T) {
			sqltest.CrashRestart(t, srv, newTestHarness(t, mode).NewDriver, mode != ModeLease)
		})
	}
}

// TestServerClockDecidesExpiry jumps the server's wall clock forward past a
// lease's TTL: the server, not the client, decides expiry, so another
// client can take the lock at once (with a larger token), and the old
// holder's next renewal learns that its lease is gone.
func TestServerClockDecidesExpiry(t *testing.T) {
	s := testserver.MariaDBWith(t, &testserver.SQLOptions{Faketime: true})
	h := &harness{base: s.URL(), mode: ModeLease, table: "dlock_test_clock"}
	var err error
	h.admin, err = adminFor(context.Background(), s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	sqltest.ClockDecidesExpiry(t, s, h.NewDriver)
}

// TestRowLockFullPool holds locks until the *sql.DB has no connection left
// for the fence increment: TryAcquire fails with an error saying so, within
// a bounded time, and leaves nothing locked behind.
func TestRowLockFullPool(t *testing.T) {
	ctx := context.Background()
	db, err := openAdmin(t)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	d, err := New(db, &Options{Mode: ModeRowLock, Table: "dlock_test_rowlock"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	base := randomName("fullpool")
	req := func(n string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: base + n, Owner: "o", TTL: 10 * time.Second}
	}
	// Create both rows first, so the attempt below fails at the fence.
	for _, n := range []string{"-1", "-2"} {
		g, err := d.TryAcquire(ctx, req(n))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Release(ctx, driver.Lease{Name: base + n, Owner: "o", Token: g.Token, Handle: g.Handle}); err != nil {
			t.Fatal(err)
		}
	}
	g1, err := d.TryAcquire(ctx, req("-1"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = d.TryAcquire(ctx, req("-2"))
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
	g2, err := d.TryAcquire(ctx, req("-2"))
	if err != nil {
		t.Fatalf("the failed attempt left the name locked: %v", err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: base + "-2", Owner: "o", Token: g2.Token, Handle: g2.Handle}); err != nil {
		t.Fatal(err)
	}
}

// TestSessionDiesAtGrant KILLs the holder's connection between taking the
// lock and incrementing the fence, and has another driver take the lock
// before the grant returns (see sqltest.DiesAtGrant). In ModeRowLock the
// increment runs on a second connection and used to hand the dead session a
// token larger than the live later holder's; in ModeGetLock it runs on the
// holder's own connection, gated on holding the lock.
func TestSessionDiesAtGrant(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
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
				a.(*Driver).testHookLocked = func(ctx context.Context, c *sql.Conn) {
					hook(ctx, func(ctx context.Context) error {
						var id int64
						if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
							return err
						}
						_, err := h.admin.ExecContext(ctx, fmt.Sprintf("KILL %d", id))
						return err
					})
				}
			}
			sqltest.DiesAtGrant(t, a, b, arm, true)
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
	for _, mode := range []Mode{ModeLease, ModeGetLock, ModeRowLock} {
		d, err := newTestHarness(t, mode).NewDriver(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds[string(mode)] = d
	}
	u, _ := url.Parse(srv.URL())
	pw, _ := u.User.Password()
	// With no idle connection kept, every call has to connect.
	sqltest.ServerDown(t, srv, ds, func(d driver.Driver) { d.(*Driver).db.SetMaxIdleConns(0) }, pw)
}

// TestPausedHolder: a session-mode holder that stops renewing past its TTL
// (the checker's pause-holder fault) loses its hold in the driver too, so
// a waiter on the same driver gets the lock once the server has ended the
// paused session (see sqltest.PausedHolder).
func TestPausedHolder(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			h := newTestHarness(t, mode)
			sqltest.PausedHolder(t, h.NewDriver, func(d driver.Driver) int { return d.(*Driver).sess.Len() })
		})
	}
}
