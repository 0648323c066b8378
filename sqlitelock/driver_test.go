package sqlitelock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

func openTest(t *testing.T, path string, opts *Options) *Driver {
	t.Helper()
	d, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func tempDB(t *testing.T) string {
	return filepath.Join(t.TempDir(), "locks.db")
}

func req(name, owner string, ttl, delay time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Name: name, Owner: owner, TTL: ttl, LockDelay: delay}
}

func lease(name, owner string, tok uint64, ttl, delay time.Duration) driver.Lease {
	return driver.Lease{Name: name, Owner: owner, Token: tok, TTL: ttl, LockDelay: delay}
}

func mustAcquire(t *testing.T, d *Driver, r driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(context.Background(), r)
	if err != nil {
		t.Fatalf("TryAcquire(%q, %q): %v", r.Name, r.Owner, err)
	}
	return g
}

func mustLocked(t *testing.T, d *Driver, r driver.AcquireRequest) *driver.LockedError {
	t.Helper()
	_, err := d.TryAcquire(context.Background(), r)
	var le *driver.LockedError
	if !errors.As(err, &le) || !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire(%q, %q) = %v, want a *LockedError", r.Name, r.Owner, err)
	}
	return le
}

// pollAcquire retries TryAcquire until it succeeds or the deadline passes.
func pollAcquire(t *testing.T, d *Driver, r driver.AcquireRequest, within time.Duration) driver.Grant {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		g, err := d.TryAcquire(context.Background(), r)
		if err == nil {
			return g
		}
		if !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("TryAcquire: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %q not granted to %q within %v", r.Name, r.Owner, within)
		}
		time.Sleep(time.Millisecond) // polling interval, not a wait for a condition
	}
}

func TestAcquireRelease(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	g := mustAcquire(t, d, req("a", "alice", 10*time.Second, 0))
	if g.Token != 1 || g.Count != 1 || g.TTL != 10*time.Second {
		t.Fatalf("first grant = %+v, want token 1, count 1, TTL 10s", g)
	}
	le := mustLocked(t, d, req("a", "bob", 10*time.Second, 0))
	if le.Token != 1 {
		t.Errorf("LockedError.Token = %d, want 1", le.Token)
	}
	if le.RetryAfter <= 9*time.Second || le.RetryAfter > 10*time.Second {
		t.Errorf("LockedError.RetryAfter = %v, want just under 10s", le.RetryAfter)
	}
	// Another name is independent.
	if g := mustAcquire(t, d, req("b", "bob", time.Second, 0)); g.Token != 1 {
		t.Errorf("token on a new name = %d, want 1", g.Token)
	}
	n, err := d.Release(ctx, lease("a", "alice", 1, 10*time.Second, 0))
	if err != nil || n != 0 {
		t.Fatalf("Release = %d, %v; want 0, nil", n, err)
	}
	if _, err := d.Release(ctx, lease("a", "alice", 1, 10*time.Second, 0)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	if g := mustAcquire(t, d, req("a", "bob", time.Second, 0)); g.Token != 2 {
		t.Fatalf("token after release = %d, want 2", g.Token)
	}
}

func TestOwnerOnlyRelease(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	g := mustAcquire(t, d, req("x", "alice", 10*time.Second, 0))
	for _, l := range []driver.Lease{
		lease("x", "bob", g.Token, time.Second, 0),         // another owner, right token
		lease("x", "alice", g.Token+1, time.Second, 0),     // right owner, wrong token
		lease("x", "alice", g.Token-1+100, time.Second, 0), // another wrong token
		lease("y", "alice", g.Token, time.Second, 0),       // a name never locked
		lease("x", "bob", 0, time.Second, 0),               // token 0 cleanup by a stranger
	} {
		if _, err := d.Release(ctx, l); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release(%+v) = %v, want ErrNotHeld", l, err)
		}
	}
	mustLocked(t, d, req("x", "bob", time.Second, 0))
	errs, err := d.Renew(ctx, []driver.Lease{lease("x", "bob", g.Token, time.Minute, 0)})
	if err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("Renew by a stranger = %v, %v; want ErrNotHeld", errs, err)
	}
	// Token 0 releases what the owner holds (cleanup after an unknown outcome).
	if n, err := d.Release(ctx, lease("x", "alice", 0, time.Second, 0)); err != nil || n != 0 {
		t.Fatalf("Release with token 0 = %d, %v; want 0, nil", n, err)
	}
	mustAcquire(t, d, req("x", "bob", time.Second, 0))
}

func TestFenceIncreasesAndSurvives(t *testing.T) {
	path := tempDB(t)
	ctx := context.Background()
	var last uint64
	for round := 0; round < 3; round++ {
		d, err := Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			owner := fmt.Sprintf("o%d-%d", round, i)
			g := mustAcquire(t, d, req("f", owner, time.Minute, 0))
			if g.Token != last+1 {
				t.Fatalf("token = %d after %d, want %d", g.Token, last, last+1)
			}
			last = g.Token
			if _, err := d.Release(ctx, lease("f", owner, g.Token, time.Minute, 0)); err != nil {
				t.Fatal(err)
			}
		}
		d.Close() // reopening the file must not reset the fence
	}
	if last != 15 {
		t.Fatalf("last token %d, want 15", last)
	}
}

func TestReentrance(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	g1 := mustAcquire(t, d, req("r", "alice", time.Minute, 0))
	g2 := mustAcquire(t, d, req("r", "alice", time.Minute, 0))
	g3 := mustAcquire(t, d, req("r", "alice", time.Minute, 0))
	if g2.Token != g1.Token || g3.Token != g1.Token || g2.Count != 2 || g3.Count != 3 {
		t.Fatalf("re-entered grants %+v %+v after %+v: want same token, counts 2 and 3", g2, g3, g1)
	}
	for want := 2; want >= 1; want-- {
		n, err := d.Release(ctx, lease("r", "alice", g1.Token, time.Minute, 0))
		if err != nil || n != want {
			t.Fatalf("Release = %d, %v; want %d", n, err, want)
		}
		mustLocked(t, d, req("r", "bob", time.Minute, 0))
	}
	if n, err := d.Release(ctx, lease("r", "alice", g1.Token, time.Minute, 0)); err != nil || n != 0 {
		t.Fatalf("last Release = %d, %v; want 0", n, err)
	}
	if g := mustAcquire(t, d, req("r", "bob", time.Minute, 0)); g.Token != g1.Token+1 {
		t.Fatalf("next holder's token %d, want %d", g.Token, g1.Token+1)
	}
}

func TestReentranceResetsTTL(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	mustAcquire(t, d, req("r", "alice", 200*time.Millisecond, 0))
	mustAcquire(t, d, req("r", "alice", time.Minute, 0))
	le := mustLocked(t, d, req("r", "bob", time.Minute, 0))
	if le.RetryAfter < 50*time.Second {
		t.Fatalf("RetryAfter after re-entry with a 1m TTL = %v, want about 1m", le.RetryAfter)
	}
}

func TestExpiryBySQLiteClock(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	const ttl = 150 * time.Millisecond
	start := time.Now()
	g := mustAcquire(t, d, req("e", "alice", ttl, 0))
	le := mustLocked(t, d, req("e", "bob", ttl, 0))
	if le.RetryAfter <= 0 || le.RetryAfter > ttl {
		t.Errorf("RetryAfter = %v, want in (0, %v]", le.RetryAfter, ttl)
	}
	g2 := pollAcquire(t, d, req("e", "bob", time.Minute, 0), 10*time.Second)
	if el := time.Since(start); el < ttl-2*time.Millisecond {
		t.Fatalf("lock taken over after %v, before the %v TTL", el, ttl)
	}
	if g2.Token != g.Token+1 || g2.Count != 1 {
		t.Fatalf("takeover grant %+v, want token %d count 1", g2, g.Token+1)
	}
	// The expired holder can neither release nor renew the new grant.
	if _, err := d.Release(ctx, lease("e", "alice", g.Token, ttl, 0)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("stale Release = %v, want ErrNotHeld", err)
	}
	errs, err := d.Renew(ctx, []driver.Lease{lease("e", "alice", g.Token, time.Minute, 0)})
	if err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("stale Renew = %v, %v; want ErrNotHeld", errs, err)
	}
	// And the owner re-acquiring after expiry is a new grant, not a re-entry.
	if _, err := d.Release(ctx, lease("e", "bob", g2.Token, time.Minute, 0)); err != nil {
		t.Fatal(err)
	}
	g3 := mustAcquire(t, d, req("e", "carol", 100*time.Millisecond, 0))
	waitFree(t, d, "e", 0)
	g4 := mustAcquire(t, d, req("e", "carol", time.Minute, 0))
	if g4.Token != g3.Token+1 || g4.Count != 1 {
		t.Fatalf("re-acquire after own expiry gave %+v, want a new grant with token %d", g4, g3.Token+1)
	}
}

func TestExpiredLeaseNotRevived(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	g := mustAcquire(t, d, req("n", "alice", 50*time.Millisecond, 0))
	waitFree(t, d, "n", 0)
	errs, err := d.Renew(ctx, []driver.Lease{lease("n", "alice", g.Token, time.Minute, 0)})
	if err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("Renew of an expired lease = %v, %v; want ErrNotHeld", errs, err)
	}
	// A late release by the expired owner is refused too, even though
	// nobody has taken the lock yet.
	if _, err := d.Release(ctx, lease("n", "alice", g.Token, time.Minute, 0)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release of an expired lease = %v; want ErrNotHeld", err)
	}
	if g2 := mustAcquire(t, d, req("n", "bob", time.Minute, 0)); g2.Token != g.Token+1 {
		t.Fatalf("token %d, want %d", g2.Token, g.Token+1)
	}
}

// waitFree polls Inspect until name's lease has expired by SQLite's clock:
// until at most delay, its lock-delay, is left before the lock can be taken
// (Inspect counts the lock-delay of a lease that ran out unreleased).
func waitFree(t *testing.T, d *Driver, name string, delay time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		infos, err := d.Inspect(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) == 1 && (infos[0].Count == 0 || infos[0].ExpiresIn <= delay) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease on %q did not expire: %+v", name, infos)
		}
		time.Sleep(time.Millisecond) // polling interval
	}
}

func TestLockDelay(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	const ttl, delay = 100 * time.Millisecond, 400 * time.Millisecond
	start := time.Now()
	g := mustAcquire(t, d, req("d", "alice", ttl, delay))
	le := mustLocked(t, d, req("d", "bob", time.Minute, 0))
	if le.RetryAfter <= ttl || le.RetryAfter > ttl+delay {
		t.Errorf("RetryAfter = %v, want in (%v, %v]", le.RetryAfter, ttl, ttl+delay)
	}
	g2 := pollAcquire(t, d, req("d", "bob", time.Minute, 0), 10*time.Second)
	if el := time.Since(start); el < ttl+delay-2*time.Millisecond {
		t.Fatalf("lock taken after %v, inside the lock-delay (TTL %v + delay %v)", el, ttl, delay)
	}
	if g2.Token != g.Token+1 {
		t.Fatalf("token %d, want %d", g2.Token, g.Token+1)
	}

	// A clean release frees at once, whatever the delay.
	if _, err := d.Release(ctx, lease("d", "bob", g2.Token, time.Minute, 0)); err != nil {
		t.Fatal(err)
	}
	g3 := mustAcquire(t, d, req("d", "carol", time.Minute, time.Hour))
	if _, err := d.Release(ctx, lease("d", "carol", g3.Token, time.Minute, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if g4 := mustAcquire(t, d, req("d", "dave", time.Minute, 0)); g4.Token != g3.Token+1 {
		t.Fatalf("token %d, want %d", g4.Token, g3.Token+1)
	}
}

func TestRenewBatch(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	held := mustAcquire(t, d, req("held", "alice", time.Second, 0))
	released := mustAcquire(t, d, req("released", "alice", time.Second, 0))
	if _, err := d.Release(ctx, lease("released", "alice", released.Token, time.Second, 0)); err != nil {
		t.Fatal(err)
	}
	taken := mustAcquire(t, d, req("taken", "alice", 30*time.Millisecond, 0))
	pollAcquire(t, d, req("taken", "bob", time.Minute, 0), 10*time.Second)
	odd := mustAcquire(t, d, req(`we"ird ☃ \ name`, "alice", time.Second, 0))

	ls := []driver.Lease{
		lease("held", "alice", held.Token, time.Minute, 0),
		lease("released", "alice", released.Token, time.Minute, 0),
		lease("taken", "alice", taken.Token, time.Minute, 0),
		lease("never", "alice", 1, time.Minute, 0),
		lease(`we"ird ☃ \ name`, "alice", odd.Token, time.Minute, time.Second),
	}
	errs, err := d.Renew(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, false, false, false, true}
	for i := range ls {
		if ok := errs[i] == nil; ok != want[i] {
			t.Errorf("Renew %q: err %v, want renewed=%v", ls[i].Name, errs[i], want[i])
		}
		if errs[i] != nil && !errors.Is(errs[i], driver.ErrNotHeld) {
			t.Errorf("Renew %q: %v does not wrap ErrNotHeld", ls[i].Name, errs[i])
		}
	}
	infos, err := d.Inspect(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == "held" || strings.HasPrefix(in.Name, "we") {
			if in.ExpiresIn < 50*time.Second {
				t.Errorf("%q expires in %v after renewal to 1m", in.Name, in.ExpiresIn)
			}
		}
	}
	// Bob's grant on "taken" is untouched by Alice's failed renewal.
	le := mustLocked(t, d, req("taken", "carol", time.Second, 0))
	if le.RetryAfter > time.Minute || le.RetryAfter < 50*time.Second {
		t.Errorf("bob's lease RetryAfter %v changed", le.RetryAfter)
	}
	if errs, err := d.Renew(ctx, nil); err != nil || len(errs) != 0 {
		t.Fatalf("Renew(nil) = %v, %v", errs, err)
	}
}

func TestRenewLargeBatch(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	const n = 1000 // 3 full statements of 256 and one padded one, in one transaction
	ls := make([]driver.Lease, n)
	for i := range ls {
		name := fmt.Sprintf("lock/%05d", i)
		g := mustAcquire(t, d, req(name, "alice", time.Minute, 0))
		ls[i] = lease(name, "alice", g.Token, time.Minute, 0)
	}
	ls[7].Token++       // one stale lease in the batch
	ls[n-1].Owner = "x" // and one in the padded last statement
	errs, err := d.Renew(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if (i == 7 || i == n-1) != (e != nil) {
			t.Fatalf("lease %d: renew error %v", i, e)
		}
	}
}

func TestInspect(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	mustAcquire(t, d, req("jobs/b", "bob", time.Minute, 0))
	mustAcquire(t, d, req("jobs/a", "alice", time.Minute, 0))
	mustAcquire(t, d, req("jobs/a", "alice", time.Minute, 0))
	g := mustAcquire(t, d, req("jobs/c", "carol", time.Minute, 0))
	if _, err := d.Release(ctx, lease("jobs/c", "carol", g.Token, time.Minute, 0)); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, d, req("other", "dave", time.Minute, 0))
	mustAcquire(t, d, req("jobs%", "erin", time.Minute, 0))

	infos, err := d.Inspect(ctx, "jobs/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 3 {
		t.Fatalf("Inspect(jobs/) = %+v, want 3 locks", infos)
	}
	a, b, c := infos[0], infos[1], infos[2]
	if a.Name != "jobs/a" || a.Owner != "alice" || a.Count != 2 || a.Token != 1 || a.Waiters != -1 ||
		a.ExpiresIn <= 50*time.Second || a.ExpiresIn > time.Minute {
		t.Errorf("jobs/a = %+v", a)
	}
	if b.Name != "jobs/b" || b.Owner != "bob" || b.Count != 1 {
		t.Errorf("jobs/b = %+v", b)
	}
	if c.Name != "jobs/c" || c.Owner != "" || c.Count != 0 || c.ExpiresIn != 0 || c.Token != 1 {
		t.Errorf("released jobs/c = %+v", c)
	}
	all, err := d.Inspect(ctx, "")
	if err != nil || len(all) != 5 {
		t.Fatalf("Inspect(\"\") = %d locks, %v; want 5", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].Name >= all[i].Name {
			t.Fatalf("not sorted: %q before %q", all[i-1].Name, all[i].Name)
		}
	}
	if none, err := d.Inspect(ctx, "nothing"); err != nil || len(none) != 0 {
		t.Fatalf("Inspect(nothing) = %+v, %v", none, err)
	}
}

func TestTablesAreIndependent(t *testing.T) {
	path := tempDB(t)
	d1 := openTest(t, path, nil)
	d2 := openTest(t, path, &Options{Table: "other_locks"})
	mustAcquire(t, d1, req("a", "alice", time.Minute, 0))
	if g := mustAcquire(t, d2, req("a", "bob", time.Minute, 0)); g.Token != 1 {
		t.Fatalf("token in second table %d, want 1", g.Token)
	}
}

func TestNewUsesCallersDB(t *testing.T) {
	db, err := sql.Open("sqlite", tempDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d, err := New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, d, req("a", "alice", time.Minute, 0))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("caller's db closed by Driver.Close: %v", err)
	}
	var owner string
	if err := db.QueryRow(`SELECT owner FROM dlock_locks WHERE name = 'a'`).Scan(&owner); err != nil || owner != "alice" {
		t.Fatalf("row = %q, %v", owner, err)
	}
}

// TestBusyRetry checks that a *sql.DB without a busy timeout still waits
// for another connection's write lock, up to Options.BusyTimeout.
func TestBusyRetry(t *testing.T) {
	path := tempDB(t)
	db, err := sql.Open("sqlite", path) // no busy_timeout: SQLite fails at once
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d, err := New(db, &Options{BusyTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	other, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	// Commit the blocking transaction shortly; TryAcquire must wait for it
	// rather than fail with SQLITE_BUSY.
	done := make(chan error, 1)
	timer := time.AfterFunc(100*time.Millisecond, func() {
		_, err := conn.ExecContext(ctx, "COMMIT")
		done <- err
	})
	defer timer.Stop()
	if _, err := d.TryAcquire(ctx, req("b", "alice", time.Minute, 0)); err != nil {
		t.Fatalf("TryAcquire behind a busy writer: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// With a short busy timeout and the file held throughout, it gives up.
	d2, err := New(db, &Options{BusyTimeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "ROLLBACK")
	start := time.Now()
	_, err = d2.TryAcquire(ctx, req("c", "alice", time.Minute, 0))
	if err == nil || errors.Is(err, driver.ErrLocked) || !isBusy(err) {
		t.Fatalf("TryAcquire on a file held by another writer = %v, want a busy error", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("gave up after %v with a 30ms busy timeout", el)
	}
}

func TestContextCancelled(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.TryAcquire(ctx, req("a", "alice", time.Minute, 0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with a cancelled context = %v", err)
	}
	if _, err := d.Release(ctx, lease("a", "alice", 1, time.Minute, 0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a cancelled context = %v", err)
	}
	if _, err := d.Renew(ctx, []driver.Lease{lease("a", "alice", 1, time.Minute, 0)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Renew with a cancelled context = %v", err)
	}
	if _, err := d.Inspect(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("Inspect with a cancelled context = %v", err)
	}
}

func TestClosed(t *testing.T) {
	d, err := Open(tempDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.TryAcquire(ctx, req("a", "alice", time.Minute, 0)); !errors.Is(err, errClosed) {
		t.Errorf("TryAcquire after Close = %v", err)
	}
	if _, err := d.Release(ctx, lease("a", "alice", 1, time.Minute, 0)); !errors.Is(err, errClosed) {
		t.Errorf("Release after Close = %v", err)
	}
	if _, err := d.Renew(ctx, []driver.Lease{lease("a", "alice", 1, time.Minute, 0)}); !errors.Is(err, errClosed) {
		t.Errorf("Renew after Close = %v", err)
	}
	if _, err := d.Inspect(ctx, ""); !errors.Is(err, errClosed) {
		t.Errorf("Inspect after Close = %v", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	// A waiting Lock on a closed driver ends at once with ErrClosed, as on
	// every other backend, instead of retrying until its context ends.
	c := dlock.New(d, nil)
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.NewMutex("a", nil).Lock(wctx); !errors.Is(err, dlock.ErrClosed) || wctx.Err() != nil {
		t.Errorf("Lock on a closed driver = %v (context: %v); want ErrClosed at once", err, wctx.Err())
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		path string
		opts *Options
		want string
	}{
		{"", nil, "path is empty"},
		{":memory:", nil, "not a file path"},
		{"file:x.db?mode=memory", nil, "not a file path"},
		{"a\x00b", nil, "NUL"},
		{dir, nil, "is a directory"},
		{filepath.Join(dir, "x.db"), &Options{Table: "bad name"}, `invalid table name "bad name"`},
		{filepath.Join(dir, "x.db"), &Options{Table: "x; DROP TABLE y"}, "invalid table name"},
		{filepath.Join(dir, "x.db"), &Options{Table: "1abc"}, "invalid table name"},
		{filepath.Join(dir, "x.db"), &Options{BusyTimeout: -time.Second}, "must not be negative"},
	} {
		d, err := Open(tc.path, tc.opts)
		if err == nil {
			d.Close()
			t.Errorf("Open(%q, %+v) succeeded", tc.path, tc.opts)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "sqlitelock: ") {
			t.Errorf("Open(%q, %+v) = %q, want it to mention %q", tc.path, tc.opts, err, tc.want)
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q, %+v) = %q, does not wrap dlock.ErrInvalid", tc.path, tc.opts, err)
		}
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	// A table of the chosen name that is not a dlock table is refused.
	path := filepath.Join(dir, "y.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE jobs (id INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := New(db, &Options{Table: "jobs"}); err == nil || !strings.Contains(err.Error(), "not a dlock table") {
		t.Errorf("New over a foreign table = %v", err)
	}
}

func TestOpenCreatesDirectories(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "c", "locks.db")
	d := openTest(t, path, nil)
	mustAcquire(t, d, req("a", "alice", time.Minute, 0))
	var mode string
	if err := d.db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v; want wal", mode, err)
	}
}

func TestLimits(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	if l := d.Limits(); l.MinTTL != time.Millisecond || l.TTLGranularity != time.Millisecond {
		t.Fatalf("Limits = %+v", l)
	}
	// A sub-millisecond TTL is rounded up, never to zero.
	g := mustAcquire(t, d, req("a", "alice", time.Microsecond, 0))
	if g.TTL != time.Millisecond {
		t.Fatalf("granted TTL %v for 1µs, want 1ms", g.TTL)
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"3.35.0", true}, {"3.54.1", true}, {"4.0", true}, {"3.35", true},
		{"3.34.9", false}, {"2.99.99", false}, {"", false}, {"x.y", false},
	} {
		if got := versionAtLeast(tc.v, minVersion); got != tc.want {
			t.Errorf("versionAtLeast(%q) = %v, want %v", tc.v, got, tc.want)
		}
	}
}

func TestLateReleaseKeepsLockDelay(t *testing.T) {
	d := openTest(t, tempDB(t), nil)
	ctx := context.Background()
	g := mustAcquire(t, d, req("late", "alice", 50*time.Millisecond, 10*time.Second))
	waitFree(t, d, "late", 10*time.Second) // expired by SQLite's clock, inside the delay
	if _, err := d.Release(ctx, lease("late", "alice", g.Token, 50*time.Millisecond, 10*time.Second)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("late Release = %v, want ErrNotHeld", err)
	}
	le := mustLocked(t, d, req("late", "bob", time.Minute, 0))
	if le.RetryAfter < 5*time.Second || le.RetryAfter > 10*time.Second {
		t.Fatalf("RetryAfter inside the lock-delay = %v, want 5s..10s", le.RetryAfter)
	}
	if le.Token != g.Token {
		t.Fatalf("LockedError.Token = %d, want %d", le.Token, g.Token)
	}
}
