package mysqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

func TestMain(m *testing.M) {
	// The tests kill connections on purpose; go-sql-driver logs each one.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	code := m.Run()
	stopServer() // before the leak check: the server's process watchers are goroutines too
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// harness runs the conformance suite against one mode. Every driver it
// makes opens its own *sql.DB from a URL, like a separate process would.
type harness struct {
	base  string
	mode  Mode
	table string
	admin *sql.DB

	mu      sync.Mutex
	drivers []*Driver
}

func openAdmin(t testing.TB) (*sql.DB, error) { return adminFor(context.Background(), serverURL(t)) }

func adminFor(_ context.Context, raw string) (*sql.DB, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	_, dsn, err := ParseURL(u)
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

func (h *harness) url() *url.URL {
	u, _ := url.Parse(h.base)
	q := u.Query()
	q.Set("mode", string(h.mode))
	q.Set("table", h.table)
	u.RawQuery = q.Encode()
	return u
}

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	d, err := open(ctx, h.url())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.drivers = append(h.drivers, d.(*Driver))
	h.mu.Unlock()
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
	h.mu.Lock()
	drivers := append([]*Driver(nil), h.drivers...)
	h.mu.Unlock()
	for _, d := range drivers {
		if id, ok := d.holderConnID(ctx, name); ok {
			_, err := h.admin.ExecContext(ctx, fmt.Sprintf("KILL %d", id))
			return err
		}
	}
	return fmt.Errorf("no holder of %q among this harness's drivers", name)
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

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// TestExternalKill KILLs a session-mode holder's connection from another
// connection: the holder's Done closes within a bounded time, and a waiter
// then gets the lock with a larger token.
func TestExternalKill(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			hn, err := newHarnessFor(mode)(ctx, t)
			if err != nil {
				t.Fatal(err)
			}
			h := hn.(*harness)
			defer h.Close()
			const ttl = time.Second
			da, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			db, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a := dlock.New(da, &dlock.Options{TTL: ttl})
			b := dlock.New(db, &dlock.Options{TTL: ttl, WaitMax: 50 * time.Millisecond})
			defer a.Close()
			defer b.Close()
			name := randomName("extkill")
			la, err := a.NewMutex(name, nil).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *dlock.Lease, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				l, err := b.NewMutex(name, nil).Lock(wctx)
				if err != nil {
					t.Errorf("waiter: %v", err)
					close(got)
					return
				}
				got <- l
			}()
			id, ok := da.(*Driver).holderConnID(ctx, name)
			if !ok {
				t.Fatal("holder has no pinned connection")
			}
			killed := time.Now()
			if _, err := h.admin.ExecContext(ctx, fmt.Sprintf("KILL %d", id)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-la.Done():
			case <-time.After(ttl + 2*time.Second):
				t.Fatalf("holder's Done still open %v after KILL", time.Since(killed))
			}
			if !errors.Is(la.Err(), dlock.ErrLeaseLost) || !errors.Is(la.Err(), driver.ErrSessionLost) {
				t.Fatalf("holder's Err = %v, want ErrLeaseLost wrapping ErrSessionLost", la.Err())
			}
			t.Logf("Done closed %v after KILL", time.Since(killed).Round(time.Millisecond))
			lb := <-got
			if lb == nil {
				return
			}
			if lb.Token() <= la.Token() {
				t.Fatalf("waiter's token %d <= killed holder's %d", lb.Token(), la.Token())
			}
			_ = lb.Unlock(ctx)
		})
	}
}

func TestURL(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"mysql://u:s3cret@127.0.0.1:1/db?mode=bogus", "unknown mode"},
		{"mysql://u:s3cret@127.0.0.1:1/db?table=bad-name", "table name"},
		{"mysql://u:s3cret@127.0.0.1:1/db?mode=", "mode is empty"},
		{"mysql://u:s3cret@127.0.0.1:1/", "no database"},
		{"mysql://u:s3cret@127.0.0.1:1/db?tls=nonsense", "nonsense"},
		{"mysql://u:s3cret@127.0.0.1:1/db?timeout=1s", "connect"},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := open(ctx, u)
		cancel()
		if err == nil {
			_ = d.Close()
			t.Fatalf("%s: opened", tc.url)
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "s3cret") {
			t.Fatalf("%s: error %q: want it to mention %q and not the password", tc.url, msg, tc.want)
		}
	}
	u, _ := url.Parse("mysql://u:p%40ss@db.example:3307/app?tls=true&mode=getlock&table=t1&timeout=2s")
	o, dsn, err := ParseURL(u)
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
	_, dsn, err := ParseURL(u)
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
			ctx := context.Background()
			hn, err := newHarnessFor(mode)(ctx, t)
			if err != nil {
				t.Fatal(err)
			}
			h := hn.(*harness)
			defer h.Close()
			da, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			dw, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a := dlock.New(da, &dlock.Options{TTL: 10 * time.Second})
			w := dlock.New(dw, &dlock.Options{TTL: 10 * time.Second})
			defer a.Close()
			defer w.Close()
			name := randomName("waiters")
			la, err := a.NewMutex(name, nil).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for i := 0; i < 100; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if l, err := w.NewMutex(name, nil).Lock(wctx); err == nil {
						_ = l.Unlock(ctx)
						t.Error("a waiter got a held lock")
					}
				}()
			}
			db := dw.(*Driver).db
			var peakOpen, peakBusy, busySum, samples int
			start := time.Now()
			for wctx.Err() == nil {
				st := db.Stats()
				peakOpen = max(peakOpen, st.OpenConnections)
				peakBusy = max(peakBusy, st.InUse)
				if time.Since(start) > 500*time.Millisecond {
					busySum += st.InUse
					samples++
				}
				tick := time.NewTimer(5 * time.Millisecond)
				select {
				case <-tick.C:
				case <-wctx.Done():
					tick.Stop()
				}
			}
			wg.Wait()
			if n := dw.(*Driver).sess.Len(); n != 0 {
				t.Fatalf("waiters pinned %d connections", n)
			}
			t.Logf("mode %s: 100 waiters on one driver: connections open at peak %d, in use at peak %d, in use on average after the first 0.5s %.1f, pinned 0",
				mode, peakOpen, peakBusy, float64(busySum)/float64(max(samples, 1)))
			_ = la.Unlock(ctx)
		})
	}
}

// TestRenewBatch renews several leases in one call, some of them stale: only
// the exact grants (name, owner and token) are renewed.
func TestRenewBatch(t *testing.T) {
	ctx := context.Background()
	hn, err := newHarnessFor(ModeLease)(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	h := hn.(*harness)
	defer h.Close()
	d, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	base := randomName("renew")
	var ls []driver.Lease
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("%s-%d", base, i)
		g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-a", TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, driver.Lease{Name: name, Owner: "owner-a", Token: g.Token, TTL: 5 * time.Second})
	}
	wrongToken, wrongOwner := ls[1], ls[2]
	wrongToken.Token++
	wrongOwner.Owner = "owner-b"
	batch := []driver.Lease{ls[0], wrongToken, wrongOwner, ls[1], ls[2], ls[0]}
	want := []bool{true, false, false, true, true, true}
	errs, err := d.Renew(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if ok := e == nil; ok != want[i] {
			t.Fatalf("lease %d (%+v): renew error %v, want renewed=%v", i, batch[i], e, want[i])
		}
		if e != nil && !errors.Is(e, driver.ErrNotHeld) {
			t.Fatalf("lease %d: %v, want ErrNotHeld", i, e)
		}
	}
}

// TestServerCrashRestart kills the server (SIGKILL) and starts it again on
// the same port: a session-mode holder's Done closes; lease rows (which a
// short restart leaves held) and fence counters survive, so every grant
// after the restart has a larger token.
func TestServerCrashRestart(t *testing.T) {
	serverURL(t)
	if srv == nil {
		t.Skip("external server: cannot restart it")
	}
	ctx := context.Background()
	for _, mode := range []Mode{ModeLease, ModeGetLock} {
		t.Run(string(mode), func(t *testing.T) {
			hn, err := newHarnessFor(mode)(ctx, t)
			if err != nil {
				t.Fatal(err)
			}
			h := hn.(*harness)
			defer h.Close()
			da, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a := dlock.New(da, &dlock.Options{TTL: time.Second})
			defer a.Close()
			name := randomName("restart")
			la, err := a.NewMutex(name, nil).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Restart(false); err != nil {
				t.Fatal(err)
			}
			if mode == ModeLease {
				// The row is durable: a restart shorter than the TTL leaves
				// the lease held and renewable; a longer one loses it.
				if la.Err() == nil {
					_ = la.Unlock(ctx)
				}
			} else {
				// The session died with the server.
				select {
				case <-la.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("holder's Done still open after the server crashed")
				}
				if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
					t.Fatalf("holder's Err = %v, want ErrLeaseLost", la.Err())
				}
			}
			db, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b := dlock.New(db, &dlock.Options{TTL: time.Second, WaitMax: 50 * time.Millisecond})
			defer b.Close()
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			lb, err := b.NewMutex(name, nil).Lock(wctx)
			if err != nil {
				t.Fatal(err)
			}
			if lb.Token() <= la.Token() {
				t.Fatalf("token after restart %d <= before %d", lb.Token(), la.Token())
			}
			_ = lb.Unlock(ctx)
		})
	}
}

// TestServerClockDecidesExpiry jumps the server's wall clock forward past a
// lease's TTL: the server, not the client, decides expiry, so another
// client can take the lock at once (with a larger token), and the old
// holder's next renewal learns that its lease is gone.
func TestServerClockDecidesExpiry(t *testing.T) {
	s := testserver.MariaDBWith(t, &testserver.SQLOptions{Faketime: true})
	ctx := context.Background()
	h := &harness{base: s.URL(), mode: ModeLease, table: "dlock_test_clock"}
	var err error
	h.admin, err = adminFor(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	da, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := dlock.New(da, &dlock.Options{TTL: 30 * time.Second})
	defer a.Close()
	db, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := dlock.New(db, nil)
	defer b.Close()
	name := randomName("clock")
	la, err := a.NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.NewMutex(name, nil).TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock on a held lock: %v", err)
	}
	if err := s.SetClockOffset(time.Minute); err != nil {
		t.Fatal(err)
	}
	lb, err := b.NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after the server's clock passed the lease's expiry: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d <= expired holder's %d", lb.Token(), la.Token())
	}
	if err := la.Extend(ctx, 30*time.Second); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Extend of the expired lease: %v, want ErrNotHeld", err)
	}
	_ = lb.Unlock(ctx)
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
	if err == nil || !strings.Contains(err.Error(), "connection") {
		t.Fatalf("second lock on a 2-connection pool: %v, want an error about connections", err)
	}
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
