// Package queuetest holds the driver-level tests and benchmark helpers that
// the queue-based drivers (etcdlock, zklock) share. Only their tests import
// it.
package queuetest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// Driver is a queue-based driver.
type Driver interface {
	driver.Driver
	driver.Queuer
}

// Backend is what the shared tests need of one driver package, against a
// running server. Every function fails t on an error.
type Backend struct {
	// NewDriver returns a driver on a connection of its own, closed when t
	// ends.
	NewDriver func(t testing.TB) Driver
	// Queue lists the queue entries (keys, nodes) of the lock name.
	Queue func(t testing.TB, name string) []string
	// Drop deletes the queue entries of name behind the driver's back.
	Drop func(t testing.TB, name string)
	// TTL is the session TTL of the drivers NewDriver makes: Grant.TTL must
	// lie between it and one second more.
	TTL time.Duration
	// CleanupAtOnce is set when a cancelled Acquire deletes its queue entry
	// before it returns (else the entry must go soon after).
	CleanupAtOnce bool
}

// Run runs the shared driver tests against be, each as a subtest.
func Run(t *testing.T, be Backend) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Backend)
	}{
		{"TryAcquireExcludesAndTokensIncrease", TryAcquireExcludesAndTokensIncrease},
		{"ReentranceAndOwners", ReentranceAndOwners},
		{"AcquireQueuesInOrder", AcquireQueuesInOrder},
		{"CancelledAcquireLeavesNothing", CancelledAcquireLeavesNothing},
		{"RenewFindsDeletedEntry", RenewFindsDeletedEntry},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, be) })
	}
}

// Main is a driver package's TestMain: it starts the single-server cluster
// its tests share with start and stores it in *shared, runs the tests, stops
// the server and then (goleak.VerifyTestMain would exit before the server
// is stopped) checks for leaked goroutines with opts. It exits with the
// tests' code, or 1 when the server cannot start or a goroutine leaked.
func Main(m *testing.M, pkg string, start func(int) (*testserver.Cluster, error), shared **testserver.Cluster, opts ...goleak.Option) {
	c, err := start(1)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s tests: cannot start the server: %v\n", pkg, err)
		os.Exit(1)
	}
	*shared = c
	code := 0
	func() {
		defer c.Stop()
		code = m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Open calls open and fails t on an error; the driver is closed when t
// ends.
func Open[D interface{ Close() error }](t testing.TB, open func() (D, error)) D {
	t.Helper()
	d, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// URLCase is one case for ParseURL: a URL and either the text its error
// must contain or a check of what it parses into.
type URLCase[P any] struct {
	URL, Err string
	Check    func(P) bool
}

// ParseURL parses each case's URL with parse. An error must contain Err
// and never the password "s3cret"; a success must pass Check.
func ParseURL[P any](t *testing.T, parse func(*url.URL) (P, error), cases []URLCase[P]) {
	t.Helper()
	for _, tc := range cases {
		u, err := url.Parse(tc.URL)
		if err != nil {
			t.Fatal(err)
		}
		p, err := parse(u)
		if tc.Err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.Err) {
				t.Errorf("%s: err %v, want %q", tc.URL, err, tc.Err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: error shows the password: %v", tc.URL, err)
			}
			continue
		}
		if err != nil || !tc.Check(p) {
			t.Errorf("%s: %+v %v", tc.URL, p, err)
		}
	}
}

// Req is a request of owner for name.
func Req(name, owner string) driver.AcquireRequest {
	return driver.AcquireRequest{Name: name, Owner: owner, TTL: time.Second}
}

// Lease is the lease of g, granted to owner on name.
func Lease(name, owner string, g driver.Grant) driver.Lease {
	return driver.Lease{Name: name, Owner: owner, Token: g.Token, Handle: g.Handle, TTL: g.TTL}
}

// Ctx is a context that ends after d or when t ends.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond until it holds, failing t if it does not within
// within.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not true within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TryAcquireExcludesAndTokensIncrease: a second driver is refused while the
// first holds, tokens increase from one holder to the next, and a stale
// release never touches the next holder's entry.
func TryAcquireExcludesAndTokensIncrease(t *testing.T, be Backend) {
	a, b := be.NewDriver(t), be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	ga, err := a.TryAcquire(ctx, Req("t1", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if ga.Count != 1 || ga.Token == 0 || ga.TTL < be.TTL || ga.TTL > be.TTL+time.Second || ga.Lost == nil {
		t.Fatalf("grant = %+v", ga)
	}
	_, err = b.TryAcquire(ctx, Req("t1", "B"))
	var le *driver.LockedError
	if !errors.As(err, &le) || !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("second TryAcquire: %v, want LockedError", err)
	}
	if q := be.Queue(t, "t1"); len(q) != 1 {
		t.Fatalf("queue after failed TryAcquire: %q, want only the holder's entry", q)
	}
	if n, err := a.Release(ctx, Lease("t1", "A", ga)); err != nil || n != 0 {
		t.Fatalf("Release = %d, %v", n, err)
	}
	gb, err := b.TryAcquire(ctx, Req("t1", "B"))
	if err != nil {
		t.Fatal(err)
	}
	if gb.Token <= ga.Token {
		t.Fatalf("token %d after %d: not increasing", gb.Token, ga.Token)
	}
	// A stale release of A's grant must not touch B's entry (etcd #22082).
	if _, err := a.Release(ctx, Lease("t1", "A", ga)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("stale Release: %v, want ErrNotHeld", err)
	}
	if errs, err := b.Renew(ctx, []driver.Lease{Lease("t1", "B", gb)}); err != nil || errs[0] != nil {
		t.Fatalf("B's grant after a stale release: %v %v", errs, err)
	}
}

// ReentranceAndOwners: another owner on the same driver is refused; the
// same owner re-enters with the same token, and only the last release
// deletes the entry.
func ReentranceAndOwners(t *testing.T, be Backend) {
	d := be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	g1, err := d.TryAcquire(ctx, Req("t2", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, Req("t2", "B")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("other owner on the same driver: %v, want ErrLocked", err)
	}
	g2, err := d.Acquire(ctx, Req("t2", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Count != 2 || g2.Token != g1.Token {
		t.Fatalf("re-entry grant %+v after %+v", g2, g1)
	}
	if n, err := d.Release(ctx, Lease("t2", "A", g2)); err != nil || n != 1 {
		t.Fatalf("first Release = %d, %v; want 1", n, err)
	}
	if len(be.Queue(t, "t2")) != 1 {
		t.Fatal("entry gone while a hold remains")
	}
	if n, err := d.Release(ctx, Lease("t2", "A", g1)); err != nil || n != 0 {
		t.Fatalf("second Release = %d, %v; want 0", n, err)
	}
	if q := be.Queue(t, "t2"); len(q) != 0 {
		t.Fatalf("entries left: %q", q)
	}
}

// AcquireQueuesInOrder: waiters get the lock in arrival order, with
// increasing tokens, and none while the holder holds.
func AcquireQueuesInOrder(t *testing.T, be Backend) {
	a := be.NewDriver(t)
	ctx := Ctx(t, 20*time.Second)
	ga, err := a.TryAcquire(ctx, Req("t3", "A"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		who string
		g   driver.Grant
		err error
	}
	got := make(chan result, 2)
	for i, who := range []string{"B", "C"} {
		d := be.NewDriver(t)
		go func() {
			g, err := d.Acquire(ctx, Req("t3", who))
			got <- result{who, g, err}
			if err == nil {
				d.Release(context.Background(), Lease("t3", who, g))
			}
		}()
		// Wait until this waiter is queued, so the order is B, C.
		Eventually(t, 5*time.Second, who+" queued", func() bool { return len(be.Queue(t, "t3")) == i+2 })
	}
	select {
	case r := <-got:
		t.Fatalf("%s acquired while A holds: %v", r.who, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := a.Release(ctx, Lease("t3", "A", ga)); err != nil {
		t.Fatal(err)
	}
	prev := ga.Token
	for _, want := range []string{"B", "C"} {
		r := <-got
		if r.err != nil || r.who != want {
			t.Fatalf("got %s (%v), want %s", r.who, r.err, want)
		}
		if r.g.Token <= prev {
			t.Fatalf("token %d not above %d", r.g.Token, prev)
		}
		prev = r.g.Token
	}
}

// CancelledAcquireLeavesNothing: a waiter cancelled in the queue, or before
// it starts, leaves no entry behind.
func CancelledAcquireLeavesNothing(t *testing.T, be Backend) {
	a, b := be.NewDriver(t), be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	ga, err := a.TryAcquire(ctx, Req("t4", "A"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(wctx, Req("t4", "B"))
		done <- err
	}()
	Eventually(t, 5*time.Second, "B queued", func() bool { return len(be.Queue(t, "t4")) == 2 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
	}
	if be.CleanupAtOnce {
		if q := be.Queue(t, "t4"); len(q) != 1 {
			t.Fatalf("queue after cancel: %q, want only A's entry", q)
		}
	}
	Eventually(t, 5*time.Second, "B's entry deleted", func() bool { return len(be.Queue(t, "t4")) == 1 })
	// Cancelled before it even starts: nothing is created, or it is deleted.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := b.Acquire(cctx, Req("t4", "B")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v", err)
	}
	Eventually(t, 5*time.Second, "no entry of B", func() bool { return len(be.Queue(t, "t4")) == 1 })
	a.Release(ctx, Lease("t4", "A", ga))
}

// RenewFindsDeletedEntry: Renew reports ErrNotHeld for a grant whose entry
// was deleted behind the driver's back, and nothing for the others.
func RenewFindsDeletedEntry(t *testing.T, be Backend) {
	d := be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	g1, err := d.TryAcquire(ctx, Req("t5a", "A"))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.TryAcquire(ctx, Req("t5b", "A"))
	if err != nil {
		t.Fatal(err)
	}
	be.Drop(t, "t5a")
	errs, err := d.Renew(ctx, []driver.Lease{Lease("t5a", "A", g1), Lease("t5b", "A", g2)})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[0], driver.ErrNotHeld) || errs[1] != nil {
		t.Fatalf("Renew errs = %v, want [ErrNotHeld nil]", errs)
	}
}

// Delay describes a backend's lock-delay for LockDelay.
type Delay struct {
	// Delay is the lock-delay the test asks for.
	Delay time.Duration
	// Lose ends a holder's grant g, made through d, without a release, and
	// returns once its entry is gone from the server; the lock-delay runs
	// from about then, up to Slack earlier.
	Lose  func(t testing.TB, d Driver, g driver.Grant)
	Slack time.Duration
	// Guard, when not nil, reports whether the lock-delay guard of name
	// exists.
	Guard func(t testing.TB, name string) bool
	// RetryAfter is set when a TryAcquire refused by a lock-delay reports
	// the time left in LockedError.RetryAfter.
	RetryAfter bool
	// StaleRelease is set when a release of the lost grant must report
	// ErrNotHeld (its driver still runs).
	StaleRelease bool
}

// LockDelay: a clean release of a grant with a lock-delay frees the lock at
// once, guard and all; a holder that ends without a release keeps the lock
// unavailable for the delay, to TryAcquire and to a waiter.
func LockDelay(t *testing.T, be Backend, ld Delay) {
	b := be.NewDriver(t)
	ctx := Ctx(t, 30*time.Second)
	withDelay := func(name, owner string) driver.AcquireRequest {
		r := Req(name, owner)
		r.LockDelay = ld.Delay
		return r
	}
	guard := func(name string, want bool, what string) {
		t.Helper()
		if ld.Guard != nil && ld.Guard(t, name) != want {
			t.Fatal(what)
		}
	}

	a := be.NewDriver(t)
	g, err := a.TryAcquire(ctx, withDelay("ld1", "A"))
	if err != nil {
		t.Fatal(err)
	}
	guard("ld1", true, "no guard for a lock-delay grant")
	if _, err := a.Release(ctx, Lease("ld1", "A", g)); err != nil {
		t.Fatal(err)
	}
	guard("ld1", false, "guard left after a release")
	gb, err := b.TryAcquire(ctx, Req("ld1", "B"))
	if err != nil {
		t.Fatalf("TryAcquire right after a clean release of a lock-delay grant: %v", err)
	}
	b.Release(ctx, Lease("ld1", "B", gb))

	ga, err := a.TryAcquire(ctx, withDelay("ld2", "A"))
	if err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	ld.Lose(t, a, ga)
	gone := time.Now()
	_, err = b.TryAcquire(ctx, Req("ld2", "B"))
	var le *driver.LockedError
	if !errors.As(err, &le) || !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire inside the lock-delay: %v, want LockedError", err)
	}
	if ld.RetryAfter && (le.RetryAfter <= 0 || le.RetryAfter > ld.Delay) {
		t.Fatalf("TryAcquire inside the lock-delay: RetryAfter %v, want it in (0, %v]", le.RetryAfter, ld.Delay)
	}
	c := be.NewDriver(t)
	gc, err := c.Acquire(ctx, Req("ld2", "C"))
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(gone)
	t.Logf("granted %v after the holder was lost, %v after its entry went", time.Since(lost).Round(time.Millisecond), waited.Round(time.Millisecond))
	if waited < ld.Delay-ld.Slack {
		t.Fatalf("granted %v after the holder's entry went; lock-delay %v not honoured", waited, ld.Delay)
	}
	if gc.Token <= ga.Token {
		t.Fatalf("token %d <= lost holder's %d", gc.Token, ga.Token)
	}
	if ld.StaleRelease {
		if _, err := a.Release(ctx, Lease("ld2", "A", ga)); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release of the lost grant: %v, want ErrNotHeld", err)
		}
	}
	c.Release(ctx, Lease("ld2", "C", gc))
	guard("ld2", false, "guard left after the delay")
}

// BehindForeign checks, while a foreign client (the backend's own lock
// recipe) holds name, that d's TryAcquire is refused and its Acquire queues
// and waits, then lets the foreign holder go with release and returns the
// grant d gets after it.
func BehindForeign(t *testing.T, ctx context.Context, be Backend, d Driver, name, foreign string, release func()) driver.Grant {
	t.Helper()
	if _, err := d.TryAcquire(ctx, Req(name, "A")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("dlock TryAcquire while %s holds: %v, want ErrLocked", foreign, err)
	}
	var acquired atomic.Bool
	got := make(chan driver.Grant, 1)
	go func() {
		g, err := d.Acquire(ctx, Req(name, "A"))
		if err != nil {
			t.Error(err)
		}
		acquired.Store(true)
		got <- g
	}()
	Eventually(t, 5*time.Second, "dlock queued behind "+foreign, func() bool { return len(be.Queue(t, name)) == 2 })
	if acquired.Load() {
		t.Fatalf("dlock acquired while %s holds", foreign)
	}
	release()
	return <-got
}

// OpenURL opens a driver from rawURL with open, takes and releases the lock
// "x" through it (running between, when not nil, while it is held), and
// checks that opening badURL (a closed port with a short connect timeout)
// fails.
func OpenURL(t *testing.T, open func(context.Context, *url.URL) (driver.Driver, error), rawURL, badURL string, between func()) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	d, err := open(Ctx(t, 20*time.Second), u)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g, err := d.TryAcquire(Ctx(t, 5*time.Second), Req("x", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if between != nil {
		between()
	}
	if _, err := d.Release(Ctx(t, 5*time.Second), Lease("x", "A", g)); err != nil {
		t.Fatal(err)
	}
	bad, err := url.Parse(badURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(Ctx(t, 5*time.Second), bad); err == nil {
		t.Fatal("OpenURL to a closed port succeeded")
	}
}

// Inspect: Inspect lists the locks under a prefix sorted by name, with the
// holder's hold count (2 on "insp/x", re-entered) and waiters (1 on
// "insp/x"), and nothing for a prefix no name has. extra are more names
// under "insp/", each acquired once, that sort around "insp/x" and test the
// backend's name escaping.
func Inspect(t *testing.T, be Backend, extra ...string) {
	a, b := be.NewDriver(t), be.NewDriver(t)
	ins, ok := a.(driver.Inspector)
	if !ok {
		t.Fatalf("%T is not a driver.Inspector", a)
	}
	ctx := Ctx(t, 10*time.Second)
	ga, err := a.TryAcquire(ctx, Req("insp/x", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, Req("insp/x", "A")); err != nil {
		t.Fatal(err)
	}
	want := []driver.LockInfo{{Name: "insp/x", Owner: "A", Token: ga.Token, Count: 2, ExpiresIn: -1, Waiters: 1}}
	for _, name := range extra {
		if _, err := a.TryAcquire(ctx, Req(name, "A")); err != nil {
			t.Fatal(err)
		}
		want = append(want, driver.LockInfo{Name: name, Owner: "A", Count: 1, ExpiresIn: -1, Waiters: 0})
	}
	sort.Slice(want, func(i, j int) bool { return want[i].Name < want[j].Name })
	go b.Acquire(ctx, Req("insp/x", "B"))
	Eventually(t, 5*time.Second, "B queued", func() bool { return len(be.Queue(t, "insp/x")) == 2 })
	infos, err := ins.Inspect(ctx, "insp/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != len(want) {
		t.Fatalf("Inspect = %+v", infos)
	}
	for i := range want {
		if want[i].Token == 0 {
			infos[i].Token = 0 // the token of an extra name is not known here
		}
		if infos[i] != want[i] {
			t.Errorf("Inspect[%d] = %+v, want %+v", i, infos[i], want[i])
		}
	}
	if infos, err := b.(driver.Inspector).Inspect(ctx, "insp/xx"); err != nil || len(infos) != 0 {
		t.Fatalf("Inspect(insp/xx) = %+v, %v", infos, err)
	}
}

// Failover is a lock held through A, waited for through B, while the
// leader of Cluster is killed.
type Failover struct {
	A, B    Driver
	Cluster *testserver.Cluster
	// Queue lists the queue entries of the lock name.
	Queue func(name string) []string
	// TTL is the drivers' session TTL.
	TTL time.Duration
}

// LeaderKilledWhileHeld kills the leader while f.A holds a lock and f.B waits
// for it. A must keep the lock or be told it lost it; B must never get the
// lock while A still believes it holds it.
func LeaderKilledWhileHeld(t *testing.T, f Failover) {
	a, b := f.A, f.B
	ctx := Ctx(t, 60*time.Second)
	ga, err := a.TryAcquire(ctx, Req("failover", "A"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := b.Acquire(ctx, Req("failover", "B"))
		got <- result{g, err}
	}()
	Eventually(t, 5*time.Second, "B queued", func() bool { return len(f.Queue("failover")) == 2 })
	leader, err := f.Cluster.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Cluster.Members[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed leader %d", leader)

	// For three TTLs, A either keeps proving its lock or learns it is lost;
	// B must not get the lock while A holds it.
	aLost := false
	confirmed := 0
	deadline := time.Now().Add(3 * f.TTL)
	for time.Now().Before(deadline) && !aLost {
		select {
		case r := <-got:
			t.Fatalf("B got the lock (%v) while A had not lost it", r.err)
		case <-ga.Lost:
			aLost = true
			continue
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		errs, err := a.Renew(rctx, []driver.Lease{Lease("failover", "A", ga)})
		cancel()
		switch {
		case err == nil && errs[0] == nil:
			confirmed++
		case err == nil && errors.Is(errs[0], driver.ErrNotHeld):
			aLost = true
		}
		time.Sleep(100 * time.Millisecond) // the pace of renewals, not a wait for a condition
	}
	t.Logf("A confirmed its lock %d times after the kill; lost: %v", confirmed, aLost)
	if !aLost {
		if confirmed == 0 {
			t.Fatal("A neither kept nor lost its lock within three TTLs")
		}
		if _, err := a.Release(ctx, Lease("failover", "A", ga)); err != nil {
			t.Fatalf("Release after failover: %v", err)
		}
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("B: %v", r.err)
		}
		if r.g.Token <= ga.Token {
			t.Fatalf("B's token %d <= A's %d", r.g.Token, ga.Token)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("B did not get the lock after A let go")
	}
}

// NativeHotLock is the hot-lock hand-off scenario of locktest.RunBenchmarks
// run with a backend's own lock recipe, for comparison in the same run: for
// 8 and 32 contenders, the median of 200 round trips of the floor made by
// roundTripFloor (a locktest.Floors method) is measured, newLocks makes one
// lock and unlock function pair per contender, all on one lock, and the
// contenders hand it around b.N times.
func NativeHotLock(b *testing.B, roundTripFloor func(context.Context) (func(context.Context) error, func(), error), newLocks func(b *testing.B, contenders int) (lock, unlock func(g int) error)) {
	for _, n := range []int{8, 32} {
		b.Run(fmt.Sprintf("contenders=%d", n), func(b *testing.B) {
			ctx := context.Background()
			rtt, cleanup, err := roundTripFloor(ctx)
			if err != nil {
				b.Fatal(err)
			}
			var ds []time.Duration
			for range 200 {
				t0 := time.Now()
				if err := rtt(ctx); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(t0))
			}
			cleanup()
			lock, unlock := newLocks(b, n)
			locktest.ReportHandoffs(b, hotLock(b, n, lock, unlock), locktest.Median(ds))
		})
	}
}

// hotLock runs the hot-lock loop of locktest's benchmark over lock and
// unlock functions and returns the hand-off latencies.
func hotLock(b *testing.B, contenders int, lock, unlock func(g int) error) []time.Duration {
	var (
		remaining  atomic.Int64
		releasedAt atomic.Int64
		mu         sync.Mutex
		handoffs   []time.Duration
		wg         sync.WaitGroup
		stop       atomic.Bool
		errOnce    sync.Once
		firstErr   error
	)
	remaining.Store(int64(b.N))
	b.ResetTimer()
	start := time.Now()
	for g := range contenders {
		wg.Go(func() {
			for !stop.Load() {
				if err := lock(g); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				if at := releasedAt.Swap(0); at != 0 {
					mu.Lock()
					handoffs = append(handoffs, time.Duration(time.Now().UnixNano()-at))
					mu.Unlock()
				}
				left := remaining.Add(-1)
				releasedAt.Store(time.Now().UnixNano())
				if left <= 0 {
					stop.Store(true)
				}
				if err := unlock(g); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	return handoffs
}
