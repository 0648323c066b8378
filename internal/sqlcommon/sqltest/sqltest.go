// Package sqltest holds the test logic pglock and mysqllock share: the
// per-package server, TestMain, and the driver-level checks that do not
// depend on the database's SQL. It is imported only by those packages'
// tests.
package sqltest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
)

// Server is one database server for a package's tests, started on first use
// (or the one the environment variable Env names) and stopped by Stop.
// It is safe for concurrent use.
type Server struct {
	Kind  string                             // the database's name, for messages
	Env   string                             // variable naming an external server's URL
	Start func() (*testserver.Server, error) // starts a private server

	once sync.Once
	srv  *testserver.Server
	url  string
	err  error
}

// URL returns the server's URL, starting it on the first call; it fails t
// if the server cannot be started.
func (s *Server) URL(t testing.TB) string {
	t.Helper()
	s.once.Do(func() {
		if u := os.Getenv(s.Env); u != "" {
			s.url = u
			return
		}
		s.srv, s.err = s.Start()
		if s.err == nil {
			s.url = s.srv.URL()
		}
	})
	if s.err != nil {
		t.Fatalf("starting %s: %v", s.Kind, s.err)
	}
	return s.url
}

// Private returns the server this package started, or nil when the tests
// use an external one (which they must not restart).
func (s *Server) Private(t testing.TB) *testserver.Server {
	t.Helper()
	s.URL(t)
	return s.srv
}

// Stop stops the server if this package started it.
func (s *Server) Stop() {
	if s.srv != nil {
		s.srv.Stop()
	}
}

// Main runs the tests, stops the server and then, if they passed, fails the
// run on leaked goroutines. It does not return.
func Main(m *testing.M, s *Server) {
	code := m.Run()
	s.Stop() // before the leak check: the server's process watchers are goroutines too
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// RandomName returns prefix with a random suffix, so that tests sharing a
// server and a table never share a lock.
func RandomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// Open makes a new driver, like a separate process would.
type Open func(context.Context) (driver.Driver, error)

func mustOpen(t testing.TB, open Open) driver.Driver {
	t.Helper()
	d, err := open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// ExternalKill takes a session-mode lock on one driver and has kill end the
// holder's connection from outside (what names how, for the log): the
// holder's Done must close within a bounded time with ErrSessionLost, and a
// waiter on a second driver must then get the lock with a larger token.
func ExternalKill(t *testing.T, open Open, kill func(ctx context.Context, holder driver.Driver, name string) error, what string) {
	ctx := context.Background()
	const ttl = time.Second
	da := mustOpen(t, open)
	db := mustOpen(t, open)
	a := dlock.New(da, &dlock.Options{TTL: ttl})
	b := dlock.New(db, &dlock.Options{TTL: ttl, WaitMax: 50 * time.Millisecond})
	defer a.Close()
	defer b.Close()
	name := RandomName("extkill")
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
	killed := time.Now()
	if err := kill(ctx, da, name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-la.Done():
	case <-time.After(ttl + 2*time.Second):
		t.Fatalf("holder's Done still open %v after %s", time.Since(killed), what)
	}
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) || !errors.Is(la.Err(), driver.ErrSessionLost) {
		t.Fatalf("holder's Err = %v, want ErrLeaseLost wrapping ErrSessionLost", la.Err())
	}
	t.Logf("Done closed %v after %s", time.Since(killed).Round(time.Millisecond), what)
	lb := <-got
	if lb == nil {
		return
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("waiter's token %d <= killed holder's %d", lb.Token(), la.Token())
	}
	_ = lb.Unlock(ctx)
}

// WaiterConnections has 100 goroutines wait for 2s on one held lock through
// one driver and samples stats (connections open and in use) every 5ms
// meanwhile. No waiter may get the lock, and afterwards pinned (the
// driver's held session locks) must report none. It returns the peaks and
// the average in use after the first half second.
func WaiterConnections(t *testing.T, open Open, stats func(waiters driver.Driver) (open, busy int), pinned func(waiters driver.Driver) int) (peakOpen, peakBusy int, avgBusy float64) {
	ctx := context.Background()
	da := mustOpen(t, open)
	dw := mustOpen(t, open)
	a := dlock.New(da, &dlock.Options{TTL: 10 * time.Second})
	w := dlock.New(dw, &dlock.Options{TTL: 10 * time.Second})
	defer a.Close()
	defer w.Close()
	name := RandomName("waiters")
	la, err := a.NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = la.Unlock(ctx) }()
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
	var busySum, samples int
	start := time.Now()
	for wctx.Err() == nil {
		o, b := stats(dw)
		peakOpen = max(peakOpen, o)
		peakBusy = max(peakBusy, b)
		if time.Since(start) > 500*time.Millisecond {
			busySum += b
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
	if n := pinned(dw); n != 0 {
		t.Fatalf("waiters pinned %d connections", n)
	}
	return peakOpen, peakBusy, float64(busySum) / float64(max(samples, 1))
}

// RenewBatch renews several leases on d (a lease-mode driver) in one call,
// some of them stale: only the exact grants (name, owner and token) may be
// renewed, and the others must fail with ErrNotHeld.
func RenewBatch(t *testing.T, d driver.Driver) {
	ctx := context.Background()
	base := RandomName("renew")
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

// CrashRestart takes a lock, kills srv (SIGKILL) and starts it again on the
// same port. A session-bound holder's Done must close; a lease row (which a
// short restart leaves held) and the fence counters survive, so the grant a
// new driver waits for afterwards must have a larger token.
func CrashRestart(t *testing.T, srv *testserver.Server, open Open, sessionBound bool) {
	ctx := context.Background()
	a := dlock.New(mustOpen(t, open), &dlock.Options{TTL: time.Second})
	defer a.Close()
	name := RandomName("restart")
	la, err := a.NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(false); err != nil {
		t.Fatal(err)
	}
	if !sessionBound {
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
	b := dlock.New(mustOpen(t, open), &dlock.Options{TTL: time.Second, WaitMax: 50 * time.Millisecond})
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
}

// ClockDecidesExpiry jumps s's wall clock (a faketime server) forward past
// a lease's TTL: the server, not the client, decides expiry, so another
// client must get the lock at once (with a larger token), and the old
// holder's next renewal must learn that its lease is gone. open makes
// lease-mode drivers on s.
func ClockDecidesExpiry(t *testing.T, s *testserver.Server, open Open) {
	ctx := context.Background()
	a := dlock.New(mustOpen(t, open), &dlock.Options{TTL: 30 * time.Second})
	defer a.Close()
	b := dlock.New(mustOpen(t, open), nil)
	defer b.Close()
	name := RandomName("clock")
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

// SameWork alternates bare (the very statements a TryLock+Unlock sends,
// issued directly) with TryLock+Unlock of m, b.N times after 5 warm-ups,
// and reports the ratio of the medians as x-same-work: the cost of the
// dlock layers alone.
func SameWork(b *testing.B, m *dlock.Mutex, bare func() error) {
	ctx := context.Background()
	var ds, fs []time.Duration
	for i := 0; i < b.N+5; i++ {
		t0 := time.Now()
		if err := bare(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		l, err := m.TryLock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		if i >= 5 {
			fs = append(fs, t1.Sub(t0))
			ds = append(ds, time.Since(t1))
		}
	}
	med := func(x []time.Duration) time.Duration {
		sort.Slice(x, func(i, j int) bool { return x[i] < x[j] })
		return x[len(x)/2]
	}
	b.ReportMetric(float64(med(ds))/float64(med(fs)), "x-same-work")
}

// ModeURL returns base (a server URL) with the drivers' own parameters
// mode and table set, as a harness hands it to the driver's URL opener.
func ModeURL(base, mode, table string) *url.URL {
	u, _ := url.Parse(base)
	q := u.Query()
	q.Set("mode", mode)
	q.Set("table", table)
	u.RawQuery = q.Encode()
	return u
}

// Drivers records the drivers a harness opened, so that its Drop can find
// the holder of a lock among them. The zero value is ready; it is safe for
// concurrent use.
type Drivers[D any] struct {
	mu   sync.Mutex
	list []D
}

// Add records d.
func (r *Drivers[D]) Add(d D) {
	r.mu.Lock()
	r.list = append(r.list, d)
	r.mu.Unlock()
}

// All returns the drivers recorded so far, oldest first.
func (r *Drivers[D]) All() []D {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]D(nil), r.list...)
}
