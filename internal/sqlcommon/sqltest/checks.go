package sqltest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
)

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
func SameWork(b *testing.B, m *dlock.Mutex, bare func() error) { Ratio(b, m, bare, "x-same-work") }

// Ratio alternates bare with TryLock+Unlock of m, b.N times after 5
// warm-ups, and reports the ratio of the medians (dlock over bare) as
// metric, with both medians in µs (dlock-p50-µs, bare-p50-µs). It also
// reports the process's mean CPU time per operation of each side
// (dlock-cpu-µs, bare-cpu-µs) and their ratio (x-cpu): on a machine the
// client shares with the server and other work, CPU time turns into wall
// time, so a ratio that grows with the load is read from x-cpu.
func Ratio(b *testing.B, m *dlock.Mutex, bare func() error, metric string) {
	ctx := context.Background()
	var ds, fs []time.Duration
	var dcpu, fcpu time.Duration
	for i := 0; i < b.N+5; i++ {
		c0, t0 := processCPU(), time.Now()
		if err := bare(); err != nil {
			b.Fatal(err)
		}
		c1, t1 := processCPU(), time.Now()
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
			fcpu += c1 - c0
			dcpu += processCPU() - c1
		}
	}
	med := func(x []time.Duration) time.Duration {
		sort.Slice(x, func(i, j int) bool { return x[i] < x[j] })
		return x[len(x)/2]
	}
	md, mf := med(ds), med(fs)
	b.ReportMetric(float64(md.Nanoseconds())/1e3, "dlock-p50-µs")
	b.ReportMetric(float64(mf.Nanoseconds())/1e3, "bare-p50-µs")
	b.ReportMetric(float64(md)/float64(mf), metric)
	if n := len(ds); n > 0 && fcpu > 0 {
		b.ReportMetric(float64(dcpu.Nanoseconds())/1e3/float64(n), "dlock-cpu-µs")
		b.ReportMetric(float64(fcpu.Nanoseconds())/1e3/float64(n), "bare-cpu-µs")
		b.ReportMetric(float64(dcpu)/float64(fcpu), "x-cpu")
	}
}

// Hook is what a test installs on a session-mode driver to run inside its
// TryAcquire with the lock just taken on the server. kill ends that
// session from outside (pg_terminate_backend, KILL), as an operator or a
// dying network would.
type Hook func(ctx context.Context, kill func(context.Context) error)

// DiesAtGrant is the regression test for a session mode's grant whose
// session dies while the grant is being made. arm installs hook on driver a
// so that a's next TryAcquire calls it once, with the lock taken on the
// server: where inWindow, between taking the lock and incrementing the
// fencing counter; otherwise after both (a mode that takes the lock and
// increments the counter in one statement has no such window). Inside the
// hook the holder's session is killed and driver b polls until it takes
// the lock, so b is the later holder.
//
// The invariant checked: a grant whose session died before its fencing
// counter moved is never returned (inWindow: a's TryAcquire must fail), and
// no token returned is larger than a later holder's. Afterwards a must be
// able to take the lock again once b releases it, with a larger token.
func DiesAtGrant(t *testing.T, a, b driver.Driver, arm func(Hook), inWindow bool) {
	ctx := context.Background()
	name := RandomName("diesatgrant")
	var (
		gb     driver.Grant
		bGot   bool
		called bool
	)
	arm(func(hctx context.Context, kill func(context.Context) error) {
		if called {
			return
		}
		called = true
		if err := kill(hctx); err != nil {
			t.Errorf("killing the holder's session: %v", err)
			return
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			g, err := b.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-b", TTL: 10 * time.Second})
			if err == nil {
				gb, bGot = g, true
				return
			}
			if !errors.Is(err, driver.ErrLocked) {
				t.Errorf("b's acquire after the kill: %v", err)
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("b did not get the lock within 10s of killing a's session")
				return
			}
			tick := time.NewTimer(5 * time.Millisecond)
			<-tick.C
		}
	})
	ga, errA := a.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-a", TTL: 10 * time.Second})
	if !called {
		t.Fatalf("the hook was not called (a's acquire: %+v, %v)", ga, errA)
	}
	if !bGot {
		t.FailNow()
	}
	t.Logf("a: %v (token %d); b, the later holder: token %d", errA, ga.Token, gb.Token)
	if errA == nil {
		if inWindow {
			t.Errorf("a's session died before the fencing counter moved, yet a was granted token %d (b, the later holder, has %d)", ga.Token, gb.Token)
		}
		if ga.Token >= gb.Token {
			t.Errorf("a returned token %d, not smaller than the later holder b's %d", ga.Token, gb.Token)
		}
		// a's session is gone: its renewal must say so.
		errs, err := a.Renew(ctx, []driver.Lease{{Name: name, Owner: "owner-a", Token: ga.Token, Handle: ga.Handle, TTL: 10 * time.Second}})
		if err == nil && errs[0] == nil {
			t.Errorf("a's lease on a killed session renewed")
		} else if err == nil && !errors.Is(errs[0], driver.ErrNotHeld) {
			t.Errorf("a's renewal: %v, want ErrNotHeld", errs[0])
		}
	} else if errors.Is(errA, driver.ErrLocked) {
		t.Errorf("a's acquire: %v; its session was killed, which is an error, not a refusal", errA)
	}
	if t.Failed() {
		return
	}
	// b still holds the lock exclusively; a can take it after b's release.
	if _, err := a.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-a", TTL: 10 * time.Second}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a's second acquire while b holds: %v, want ErrLocked", err)
	}
	if _, err := b.Release(ctx, driver.Lease{Name: name, Owner: "owner-b", Token: gb.Token, Handle: gb.Handle}); err != nil {
		t.Fatalf("b's release: %v", err)
	}
	g, err := a.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("a's acquire after b's release: %v", err)
	}
	if g.Token <= gb.Token {
		t.Errorf("a's token after b's release %d <= b's %d", g.Token, gb.Token)
	}
	if _, err := a.Release(ctx, driver.Lease{Name: name, Owner: "owner-a", Token: g.Token, Handle: g.Handle}); err != nil {
		t.Fatalf("a's release: %v", err)
	}
}

// ServerDown kills srv (SIGKILL) under drivers opened on it (one per mode,
// by mode name). forget makes a driver drop its idle pool connections, so
// that its next call has to connect. Each driver's TryAcquire must then
// fail within two seconds with an error that names the real cause (the
// refused connection), not a full pool, and that does not contain secret.
// srv is restarted afterwards, and every driver must take a lock again.
func ServerDown(t *testing.T, srv *testserver.Server, drivers map[string]driver.Driver, forget func(driver.Driver), secret string) {
	ctx := context.Background()
	modes := make([]string, 0, len(drivers))
	for m := range drivers {
		modes = append(modes, m)
	}
	sort.Strings(modes)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = srv.Restart(false)
		}
	}()
	for _, m := range modes {
		d := drivers[m]
		forget(d)
		start := time.Now()
		_, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: RandomName("down"), Owner: "o", TTL: time.Second})
		took := time.Since(start)
		t.Logf("%s: %v after %v", m, err, took.Round(time.Microsecond))
		switch {
		case err == nil:
			t.Errorf("%s: TryAcquire on a dead server succeeded", m)
		case strings.Contains(err.Error(), "no free"):
			t.Errorf("%s: a dead server reported as a full pool: %v", m, err)
		case !strings.Contains(err.Error(), "connection refused"):
			t.Errorf("%s: error %q does not name the cause (connection refused)", m, err)
		case secret != "" && strings.Contains(err.Error(), secret):
			t.Errorf("%s: error %q contains the password", m, err)
		}
		if took > 2*time.Second {
			t.Errorf("%s: failing took %v", m, took)
		}
	}
	restarted = true
	if err := srv.Restart(false); err != nil {
		t.Fatal(err)
	}
	for _, m := range modes {
		d := drivers[m]
		name := RandomName("up")
		g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: time.Second})
		if err != nil {
			t.Errorf("%s: TryAcquire after the restart: %v", m, err)
			continue
		}
		if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g.Token, Handle: g.Handle}); err != nil {
			t.Errorf("%s: release after the restart: %v", m, err)
		}
	}
}

// pausable is a driver whose Renew can be stopped, as a process stopped
// with SIGSTOP stops renewing: while paused a Renew sends nothing and waits
// for its context to end (the dlock package bounds it by the lease's
// validity deadline). Everything else goes to the driver as it is.
type pausable struct {
	driver.Driver
	mu     sync.Mutex
	paused bool
}

func (p *pausable) pause(on bool) {
	p.mu.Lock()
	p.paused = on
	p.mu.Unlock()
}

// Renew implements driver.Driver.
func (p *pausable) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	p.mu.Lock()
	paused := p.paused
	p.mu.Unlock()
	if paused {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return p.Driver.Renew(ctx, ls)
}

// PausedHolder is the checker's pause-holder fault within one process: a
// session-mode holder stops renewing for 1.5 × TTL (its lease is lost by
// its deadline, and the server's idle timeout ends its session), then
// resumes, and a waiter on the same driver must get the lock within
// 2 × TTL (plus slack) of the pause, with a larger token. Afterwards
// pinned (the driver's listed session holds) must count only the waiter's.
// Before the fix, the lost hold stayed listed with its dead connection and
// the waiter was refused locally, without asking the server, for ever.
func PausedHolder(t *testing.T, open Open, pinned func(driver.Driver) int) {
	ctx := context.Background()
	const ttl = time.Second
	d := &pausable{Driver: mustOpen(t, open)}
	c := dlock.New(d, &dlock.Options{TTL: ttl, WaitMax: 50 * time.Millisecond})
	defer c.Close()
	name := RandomName("paused")
	la, err := c.NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.pause(true)
	paused := time.Now()
	got := make(chan *dlock.Lease, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 5*ttl)
		defer cancel()
		l, err := c.NewMutex(name, nil).Lock(wctx)
		if err != nil {
			t.Errorf("waiter on the paused holder's driver: %v (%v after the pause)", err, time.Since(paused).Round(time.Millisecond))
			close(got)
			return
		}
		got <- l
	}()
	select {
	case <-la.Done():
	case <-time.After(2 * ttl):
		t.Fatalf("paused holder's Done still open %v after the pause", time.Since(paused))
	}
	resume := time.NewTimer(time.Until(paused.Add(ttl * 3 / 2)))
	select {
	case <-resume.C:
		d.pause(false)
	case l := <-got:
		// Granted while paused: the hold ended on its own.
		resume.Stop()
		d.pause(false)
		got <- l
	}
	lb := <-got
	if lb == nil {
		return
	}
	took := time.Since(paused)
	t.Logf("waiter granted %v after the pause (TTL %v)", took.Round(time.Millisecond), ttl)
	if bound := 2*ttl + 500*time.Millisecond; took > bound {
		t.Errorf("waiter granted %v after the pause, want within %v", took, bound)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("waiter's token %d <= paused holder's %d", lb.Token(), la.Token())
	}
	if n := pinned(d.Driver); n != 1 {
		t.Errorf("%d session holds listed while only the waiter holds the lock", n)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Error(err)
	}
}

// Uncontended runs TryLock+Unlock through a Client on one name, alone, in
// each of modes (a sub-benchmark each); client returns the Client of a
// driver in mode, closed when b ends. Run under strace to count the Go
// netpoller's wake-ups (8-byte eventfd writes) per op, e.g. for pglock:
//
//	go test -c -o pglock.test ./pglock
//	strace -f -e trace=write ./pglock.test -test.run XXX -test.bench 'Uncontended/advisory' -test.benchtime 300x 2>&1 | grep -c '"\\1\\0\\0\\0\\0\\0\\0\\0", 8'
func Uncontended(b *testing.B, modes []string, client func(b *testing.B, mode string) *dlock.Client) {
	for _, mode := range modes {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			m := client(b, mode).NewMutex(RandomName("uncontended"), nil)
			for b.Loop() {
				l, err := m.TryLock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
