package queuetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// KindDriver is a queue-based driver with read/write locks, semaphores and
// Inspect.
type KindDriver interface {
	Driver
	driver.Kinder
	driver.Inspector
}

// RunKinds runs the shared tests of read/write locks and semaphores against
// be, whose drivers must be KindDrivers, each as a subtest.
func RunKinds(t *testing.T, be Backend) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Backend)
	}{
		{"KindsAreApart", KindsAreApart},
		{"ReadersShareWriterExcludes", ReadersShareWriterExcludes},
		{"WriterPreference", WriterPreference},
		{"WaitingReadersShare", WaitingReadersShare},
		{"SemaphoreLimitAndOrder", SemaphoreLimitAndOrder},
		{"SemaphorePermitsStored", SemaphorePermitsStored},
		{"KindReentry", KindReentry},
		{"KindCancelledAcquireLeavesNothing", KindCancelledAcquireLeavesNothing},
		{"KindInspect", KindInspect},
		{"KindLockDelay", KindLockDelay},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, be) })
	}
}

// KindReq is a request of kind k (of permits permits, for a semaphore).
func KindReq(k driver.Kind, name, owner string, permits int) driver.AcquireRequest {
	r := Req(name, owner)
	r.Kind = k
	if k == driver.Permit {
		r.Permits = permits
	}
	return r
}

// KindLease is the lease of g, granted on a request r.
func KindLease(r driver.AcquireRequest, g driver.Grant) driver.Lease {
	l := Lease(r.Name, r.Owner, g)
	l.Kind, l.Permits, l.LockDelay = r.Kind, r.Permits, r.LockDelay
	return l
}

func kd(t testing.TB, be Backend) KindDriver {
	t.Helper()
	d, ok := be.NewDriver(t).(KindDriver)
	if !ok {
		t.Fatal("driver has no kinds or no Inspect")
	}
	return d
}

type held struct {
	d driver.Driver
	r driver.AcquireRequest
	g driver.Grant
}

func take(t testing.TB, ctx context.Context, d KindDriver, r driver.AcquireRequest) held {
	t.Helper()
	g, err := d.TryAcquire(ctx, r)
	if err != nil {
		t.Fatalf("TryAcquire %v %q by %q: %v", r.Kind, r.Name, r.Owner, err)
	}
	if g.Token == 0 || g.Count != 1 || g.Lost == nil {
		t.Fatalf("grant %+v", g)
	}
	return held{d, r, g}
}

func (h held) release(t testing.TB, ctx context.Context) {
	t.Helper()
	if n, err := h.d.Release(ctx, KindLease(h.r, h.g)); err != nil || n != 0 {
		t.Fatalf("Release %v %q by %q = %d, %v", h.r.Kind, h.r.Name, h.r.Owner, n, err)
	}
}

func refused(t testing.TB, ctx context.Context, d KindDriver, r driver.AcquireRequest) {
	t.Helper()
	_, err := d.TryAcquire(ctx, r)
	var le *driver.LockedError
	if !errors.As(err, &le) || !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire %v %q by %q: %v, want a LockedError", r.Kind, r.Name, r.Owner, err)
	}
}

// acquiring runs Acquire of r on d in the background.
func acquiring(ctx context.Context, d KindDriver, r driver.AcquireRequest) chan result {
	ch := make(chan result, 1)
	go func() {
		g, err := d.Acquire(ctx, r)
		ch <- result{held{d, r, g}, err}
	}()
	return ch
}

type result struct {
	h   held
	err error
}

func granted(t testing.TB, ch chan result, what string) held {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.h
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: not granted within 15s", what)
	}
	return held{}
}

func notGranted(t testing.TB, ch chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: returned early: %+v, %v", what, r.h.g, r.err)
	default:
	}
}

// info returns the LockInfo of kind k (Write for a read/write lock) of name.
func info(t testing.TB, ctx context.Context, d KindDriver, name string, k driver.Kind) (driver.LockInfo, bool) {
	t.Helper()
	infos, err := d.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == name && in.Kind == k {
			return in, true
		}
	}
	return driver.LockInfo{}, false
}

// waiters waits until the lock of kind k of name has n waiters.
func waiters(t testing.TB, ctx context.Context, d KindDriver, name string, k driver.Kind, n int) {
	t.Helper()
	Eventually(t, 10*time.Second, "waiters queued", func() bool {
		in, ok := info(t, ctx, d, name, k)
		return (n == 0 && !ok) || in.Waiters == n
	})
}

// KindsAreApart: a name's mutex, read/write lock and semaphore are three
// locks: holding one never excludes another.
func KindsAreApart(t *testing.T, be Backend) {
	a, b := kd(t, be), kd(t, be)
	ctx := Ctx(t, 20*time.Second)
	m := take(t, ctx, a, Req("k1", "A"))
	w := take(t, ctx, b, KindReq(driver.Write, "k1", "B", 0))
	p := take(t, ctx, b, KindReq(driver.Permit, "k1", "B", 1))
	refused(t, ctx, a, KindReq(driver.Read, "k1", "A", 0))
	refused(t, ctx, a, KindReq(driver.Permit, "k1", "A", 1))
	refused(t, ctx, b, Req("k1", "B"))
	for _, h := range []held{m, w, p} {
		h.release(t, ctx)
	}
	// Nested names do not meet either.
	x := take(t, ctx, a, KindReq(driver.Write, "k1/x", "A", 0))
	y := take(t, ctx, b, KindReq(driver.Write, "k1", "B", 0))
	x.release(t, ctx)
	y.release(t, ctx)
}

// ReadersShareWriterExcludes: readers share; a writer waits for them and
// excludes readers and writers; tokens of the read/write lock increase from
// every grant to the next.
func ReadersShareWriterExcludes(t *testing.T, be Backend) {
	a, b, c := kd(t, be), kd(t, be), kd(t, be)
	ctx := Ctx(t, 20*time.Second)
	r1 := take(t, ctx, a, KindReq(driver.Read, "k2", "A", 0))
	r2 := take(t, ctx, b, KindReq(driver.Read, "k2", "B", 0))
	if r2.g.Token <= r1.g.Token {
		t.Fatalf("reader tokens %d then %d", r1.g.Token, r2.g.Token)
	}
	refused(t, ctx, c, KindReq(driver.Write, "k2", "C", 0))
	r1.release(t, ctx)
	refused(t, ctx, c, KindReq(driver.Write, "k2", "C", 0))
	r2.release(t, ctx)
	w := take(t, ctx, c, KindReq(driver.Write, "k2", "C", 0))
	if w.g.Token <= r2.g.Token {
		t.Fatalf("writer token %d after reader %d", w.g.Token, r2.g.Token)
	}
	refused(t, ctx, a, KindReq(driver.Read, "k2", "A", 0))
	refused(t, ctx, b, KindReq(driver.Write, "k2", "B", 0))
	w.release(t, ctx)
	r3 := take(t, ctx, a, KindReq(driver.Read, "k2", "A", 0))
	if r3.g.Token <= w.g.Token {
		t.Fatalf("reader token %d after writer %d", r3.g.Token, w.g.Token)
	}
	r3.release(t, ctx)
}

// WriterPreference: once a writer waits, TryAcquire of a reader is refused
// and a waiting reader is granted only after the writer; grants come in
// queue order with increasing tokens.
func WriterPreference(t *testing.T, be Backend) {
	a, b, c := kd(t, be), kd(t, be), kd(t, be)
	ctx := Ctx(t, 30*time.Second)
	r1 := take(t, ctx, a, KindReq(driver.Read, "k3", "A", 0))
	wch := acquiring(ctx, b, KindReq(driver.Write, "k3", "B", 0))
	waiters(t, ctx, a, "k3", driver.Write, 1)
	refused(t, ctx, c, KindReq(driver.Read, "k3", "C", 0))
	rch := acquiring(ctx, c, KindReq(driver.Read, "k3", "C", 0))
	waiters(t, ctx, a, "k3", driver.Write, 2)
	notGranted(t, wch, "writer while a reader holds")
	r1.release(t, ctx)
	w := granted(t, wch, "writer after the reader left")
	notGranted(t, rch, "reader queued behind a writer")
	if w.g.Token <= r1.g.Token {
		t.Fatalf("writer token %d after reader %d", w.g.Token, r1.g.Token)
	}
	w.release(t, ctx)
	r2 := granted(t, rch, "reader after the writer left")
	if r2.g.Token <= w.g.Token {
		t.Fatalf("reader token %d after writer %d", r2.g.Token, w.g.Token)
	}
	r2.release(t, ctx)
}

// WaitingReadersShare: readers queued behind a writer are all granted when
// it leaves, together.
func WaitingReadersShare(t *testing.T, be Backend) {
	a, b, c := kd(t, be), kd(t, be), kd(t, be)
	ctx := Ctx(t, 30*time.Second)
	w := take(t, ctx, a, KindReq(driver.Write, "k4", "A", 0))
	ch1 := acquiring(ctx, b, KindReq(driver.Read, "k4", "B", 0))
	ch2 := acquiring(ctx, c, KindReq(driver.Read, "k4", "C", 0))
	waiters(t, ctx, a, "k4", driver.Write, 2)
	w.release(t, ctx)
	r1 := granted(t, ch1, "first reader")
	r2 := granted(t, ch2, "second reader")
	in, _ := info(t, ctx, a, "k4", driver.Write)
	if in.Readers != 2 || in.Waiters != 0 {
		t.Fatalf("Inspect with two readers: %+v", in)
	}
	r1.release(t, ctx)
	r2.release(t, ctx)
}

// SemaphoreLimitAndOrder: at most permits holders; waiters are granted in
// arrival order as permits come back, with tokens above every earlier grant.
func SemaphoreLimitAndOrder(t *testing.T, be Backend) {
	a, b, c, e := kd(t, be), kd(t, be), kd(t, be), kd(t, be)
	ctx := Ctx(t, 30*time.Second)
	p1 := take(t, ctx, a, KindReq(driver.Permit, "k5", "A", 2))
	p2 := take(t, ctx, b, KindReq(driver.Permit, "k5", "B", 2))
	if p2.g.Token <= p1.g.Token {
		t.Fatalf("permit tokens %d then %d", p1.g.Token, p2.g.Token)
	}
	refused(t, ctx, c, KindReq(driver.Permit, "k5", "C", 2))
	ch3 := acquiring(ctx, c, KindReq(driver.Permit, "k5", "C", 2))
	waiters(t, ctx, a, "k5", driver.Permit, 1)
	ch4 := acquiring(ctx, e, KindReq(driver.Permit, "k5", "E", 2))
	waiters(t, ctx, a, "k5", driver.Permit, 2)
	p2.release(t, ctx)
	p3 := granted(t, ch3, "first waiter")
	notGranted(t, ch4, "second waiter while both permits are taken")
	if p3.g.Token <= p2.g.Token {
		t.Fatalf("permit token %d after %d", p3.g.Token, p2.g.Token)
	}
	p1.release(t, ctx)
	p4 := granted(t, ch4, "second waiter")
	if p4.g.Token <= p3.g.Token {
		t.Fatalf("permit token %d after %d", p4.g.Token, p3.g.Token)
	}
	p3.release(t, ctx)
	p4.release(t, ctx)
}

// SemaphorePermitsStored: a request with another permit count is refused
// with ErrInvalid and leaves nothing; once the semaphore is idle, a new
// count is taken.
func SemaphorePermitsStored(t *testing.T, be Backend) {
	a, b := kd(t, be), kd(t, be)
	ctx := Ctx(t, 20*time.Second)
	p := take(t, ctx, a, KindReq(driver.Permit, "k6", "A", 2))
	for _, wait := range []bool{false, true} {
		r := KindReq(driver.Permit, "k6", "B", 3)
		var err error
		if wait {
			_, err = b.Acquire(ctx, r)
		} else {
			_, err = b.TryAcquire(ctx, r)
		}
		if !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("permits 3 on a semaphore of 2 (wait %v): %v, want ErrInvalid", wait, err)
		}
	}
	in, _ := info(t, ctx, a, "k6", driver.Permit)
	if in.Permits != 2 || in.Holders != 1 || in.Waiters != 0 {
		t.Fatalf("Inspect after refusals: %+v", in)
	}
	q := take(t, ctx, b, KindReq(driver.Permit, "k6", "B", 2))
	q.release(t, ctx)
	p.release(t, ctx)
	r := take(t, ctx, b, KindReq(driver.Permit, "k6", "B", 3))
	r.release(t, ctx)
}

// KindReentry: the same owner taking the same kind of the same name again
// re-enters (count up, token unchanged); the read and write sides are apart.
func KindReentry(t *testing.T, be Backend) {
	a, b := kd(t, be), kd(t, be)
	ctx := Ctx(t, 20*time.Second)
	for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
		r := KindReq(k, "k7", "A", 1)
		h := take(t, ctx, a, r)
		g2, err := a.Acquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if g2.Count != 2 || g2.Token != h.g.Token {
			t.Fatalf("%v re-entry %+v after %+v", k, g2, h.g)
		}
		if k != driver.Read {
			refused(t, ctx, b, KindReq(k, "k7", "B", 1))
		}
		if n, err := a.Release(ctx, KindLease(r, g2)); err != nil || n != 1 {
			t.Fatalf("%v nested release = %d, %v", k, n, err)
		}
		h.release(t, ctx)
	}
	// A reader asking to write is a writer behind readers, itself
	// included.
	rd := take(t, ctx, a, KindReq(driver.Read, "k7", "A", 0))
	refused(t, ctx, a, KindReq(driver.Write, "k7", "A", 0))
	rd.release(t, ctx)
}

// KindCancelledAcquireLeavesNothing: a waiting writer or permit whose
// context ends leaves no queue entry, and later requests are not held back.
func KindCancelledAcquireLeavesNothing(t *testing.T, be Backend) {
	a, b := kd(t, be), kd(t, be)
	ctx := Ctx(t, 30*time.Second)
	for _, k := range []driver.Kind{driver.Write, driver.Permit} {
		h := take(t, ctx, a, KindReq(k, "k8", "A", 1))
		wctx, cancel := context.WithCancel(ctx)
		ch := acquiring(wctx, b, KindReq(k, "k8", "B", 1))
		waiters(t, ctx, a, "k8", k, 1)
		cancel()
		select {
		case r := <-ch:
			if !errors.Is(r.err, context.Canceled) {
				t.Fatalf("cancelled %v Acquire: %v", k, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("cancelled %v Acquire did not return", k)
		}
		waiters(t, ctx, a, "k8", k, 0)
		h.release(t, ctx)
	}
	r := take(t, ctx, a, KindReq(driver.Read, "k8", "A", 0))
	r.release(t, ctx)
}

// KindInspect: Inspect lists a name's kinds apart, with readers, permits,
// holders and waiters.
func KindInspect(t *testing.T, be Backend) {
	a, b, c := kd(t, be), kd(t, be), kd(t, be)
	ctx := Ctx(t, 30*time.Second)
	r1 := take(t, ctx, a, KindReq(driver.Read, "k9", "A", 0))
	r2 := take(t, ctx, b, KindReq(driver.Read, "k9", "B", 0))
	wch := acquiring(ctx, c, KindReq(driver.Write, "k9", "C", 0))
	waiters(t, ctx, a, "k9", driver.Write, 1)
	p := take(t, ctx, a, KindReq(driver.Permit, "k9", "A", 3))
	m := take(t, ctx, b, Req("k9", "B"))
	infos, err := a.Inspect(ctx, "k9")
	if err != nil {
		t.Fatal(err)
	}
	got := map[driver.Kind]driver.LockInfo{}
	for _, in := range infos {
		if in.Name == "k9" {
			got[in.Kind] = in
		}
	}
	if in := got[driver.Exclusive]; in.Owner != "B" || in.Token != m.g.Token {
		t.Errorf("mutex: %+v", in)
	}
	if in := got[driver.Write]; in.Readers != 2 || in.Waiters != 1 || in.Owner != "" || in.Token != r2.g.Token {
		t.Errorf("read/write lock: %+v", in)
	}
	if in := got[driver.Permit]; in.Permits != 3 || in.Holders != 1 || in.Waiters != 0 || in.Owner != "A" || in.Token != p.g.Token {
		t.Errorf("semaphore: %+v", in)
	}
	r1.release(t, ctx)
	r2.release(t, ctx)
	w := granted(t, wch, "writer")
	if in, _ := info(t, ctx, a, "k9", driver.Write); in.Owner != "C" || in.Readers != 0 || in.Token != w.g.Token {
		t.Errorf("read/write lock held for writing: %+v", in)
	}
	for _, h := range []held{w, p, m} {
		h.release(t, ctx)
	}
}

// KindLockDelay: a read or write holder that ends without a release keeps
// its own place taken for its lock-delay (a reader blocks writers but not
// readers, a writer blocks both); a clean release frees it at once. It
// needs be.Kill.
func KindLockDelay(t *testing.T, be Backend) {
	if be.Kill == nil {
		t.Fatal("Backend.Kill is needed")
	}
	const delay = 3 * time.Second
	a, b := kd(t, be), kd(t, be)
	ctx := Ctx(t, 60*time.Second)
	with := func(k driver.Kind, owner string) driver.AcquireRequest {
		r := KindReq(k, "k10", owner, 0)
		r.LockDelay = delay
		return r
	}
	// A clean release frees the lock at once.
	r := take(t, ctx, a, with(driver.Read, "A"))
	r.release(t, ctx)
	w := take(t, ctx, b, KindReq(driver.Write, "k10", "B", 0))
	w.release(t, ctx)

	// A lost reader: writers wait out its delay, readers do not.
	x := kd(t, be)
	take(t, ctx, x, with(driver.Read, "X"))
	be.Kill(t, x)
	Eventually(t, 20*time.Second, "the killed reader's grant ended", func() bool {
		in, ok := info(t, ctx, a, "k10", driver.Write)
		return !ok || in.Readers == 0
	})
	gone := time.Now()
	refused(t, ctx, b, KindReq(driver.Write, "k10", "B", 0))
	rd := take(t, ctx, a, KindReq(driver.Read, "k10", "A", 0))
	rd.release(t, ctx)
	g, err := b.Acquire(ctx, KindReq(driver.Write, "k10", "B", 0))
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(gone); waited < delay-200*time.Millisecond {
		t.Fatalf("writer granted %v after the reader's grant ended; lock-delay %v not honoured", waited, delay)
	}
	if _, err := b.Release(ctx, KindLease(KindReq(driver.Write, "k10", "B", 0), g)); err != nil {
		t.Fatal(err)
	}

	// A lost writer: readers wait out its delay too.
	y := kd(t, be)
	take(t, ctx, y, with(driver.Write, "Y"))
	be.Kill(t, y)
	Eventually(t, 20*time.Second, "the killed writer's grant ended", func() bool {
		in, ok := info(t, ctx, a, "k10", driver.Write)
		return !ok || in.Owner == "lock-delay" // listed as kept by its guard
	})
	gone = time.Now()
	refused(t, ctx, a, KindReq(driver.Read, "k10", "A", 0))
	g, err = a.Acquire(ctx, KindReq(driver.Read, "k10", "A", 0))
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(gone); waited < delay-200*time.Millisecond {
		t.Fatalf("reader granted %v after the writer's grant ended; lock-delay %v not honoured", waited, delay)
	}
	if _, err := a.Release(ctx, KindLease(KindReq(driver.Read, "k10", "A", 0), g)); err != nil {
		t.Fatal(err)
	}
}
