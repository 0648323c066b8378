package dlock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

// plainDriver hides every optional capability of a memlock driver but the
// mutex: a backend that knows nothing of kinds.
type plainDriver struct{ driver.Driver }

// noKinds is a driver.Kinder that supports no kind beyond the mutex.
type noKinds struct{ *memlock.Driver }

func (noKinds) SupportsKind(driver.Kind) bool { return false }

func TestKindsRefusedWithoutDriverSupport(t *testing.T) {
	for _, d := range []driver.Driver{plainDriver{memlock.NewBackend().NewDriver()}, noKinds{memlock.NewBackend().NewDriver()}} {
		c := dlock.New(d, nil)
		ctx := context.Background()
		rw := c.NewRWMutex("x", nil)
		sem := c.NewSemaphore("x", 3, nil)
		for what, f := range map[string]func(context.Context) (*dlock.Lease, error){
			"TryRLock": rw.TryRLock, "RLock": rw.RLock, "TryLock": rw.TryLock, "Lock": rw.Lock,
			"TryAcquire": sem.TryAcquire, "Acquire": sem.Acquire,
		} {
			l, err := f(ctx)
			if err == nil {
				t.Fatalf("%T: %s granted a %s lease on a driver without kinds", d, what, l.Kind())
			}
			if !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), "this backend") {
				t.Fatalf("%T: %s = %v, want ErrUnsupported naming the backend's lack", d, what, err)
			}
		}
		// The mutex and the MultiMutex still work.
		ml, err := c.NewMultiMutex([]string{"b", "a"}, nil).TryLock(ctx)
		if err != nil {
			t.Fatalf("%T: MultiMutex.TryLock: %v", d, err)
		}
		_ = ml.Unlock(ctx)
		_ = c.Close()
	}
}

func TestSemaphorePermitsValidated(t *testing.T) {
	c, _ := newMem(t, nil)
	for _, n := range []int{0, -1, 1 << 31} {
		sem := c.NewSemaphore("s", n, nil)
		if _, err := sem.TryAcquire(context.Background()); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "permits") {
			t.Fatalf("NewSemaphore(%d).TryAcquire = %v, want ErrInvalid naming permits", n, err)
		}
		if sem.Permits() != n {
			t.Fatalf("Permits() = %d, want %d", sem.Permits(), n)
		}
	}
	sem := c.NewSemaphore("s", 2, nil)
	l, err := sem.TryAcquire(context.Background())
	if err != nil || l.Kind() != "permit" {
		t.Fatalf("TryAcquire = %v, %v; want a permit lease", l, err)
	}
	// A different count is refused at once, not retried by a waiting Acquire.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.NewSemaphore("s", 3, nil).Acquire(ctx); !errors.Is(err, dlock.ErrInvalid) || ctx.Err() != nil {
		t.Fatalf("Acquire with another count = %v (ctx %v), want ErrInvalid at once", err, ctx.Err())
	}
}

// recorder records what a memlock driver is asked.
type recorder struct {
	*memlock.Driver
	mu        sync.Mutex
	attempts  []time.Time // refused waiting write attempts
	reqs      []driver.AcquireRequest
	withdrawn []driver.AcquireRequest
	renewed   [][]driver.Lease
	released  []driver.Lease
	multi     int
	multiErr  error
}

func (r *recorder) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := r.Driver.TryAcquire(ctx, req)
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	if req.Waiting && err != nil {
		r.attempts = append(r.attempts, time.Now())
	}
	r.mu.Unlock()
	return g, err
}

func (r *recorder) Withdraw(ctx context.Context, req driver.AcquireRequest) error {
	r.mu.Lock()
	r.withdrawn = append(r.withdrawn, req)
	r.mu.Unlock()
	return r.Driver.Withdraw(ctx, req)
}

func (r *recorder) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	r.mu.Lock()
	r.renewed = append(r.renewed, slices.Clone(ls))
	r.mu.Unlock()
	return r.Driver.Renew(ctx, ls)
}

func (r *recorder) Release(ctx context.Context, l driver.Lease) (int, error) {
	r.mu.Lock()
	r.released = append(r.released, l)
	r.mu.Unlock()
	return r.Driver.Release(ctx, l)
}

func (r *recorder) TryAcquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	r.mu.Lock()
	r.multi++
	err := r.multiErr
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return r.Driver.TryAcquireMulti(ctx, reqs)
}

func (r *recorder) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	return r.Driver.Subscribe(ctx, name)
}

func newRecorder(t *testing.T, b *memlock.Backend, opts *dlock.Options) (*dlock.Client, *recorder) {
	t.Helper()
	r := &recorder{Driver: b.NewDriver()}
	c := dlock.New(r, opts)
	t.Cleanup(func() { _ = c.Close() })
	return c, r
}

// TestWaitingWriterKeepsItsMarkFresh: a waiting Lock retries at least every
// TTL/3 while refused, even when the holder's remaining time (RetryAfter)
// and notifications would let it sleep up to a TTL, so a backend's
// waiting-writer mark that lives one TTL never lapses.
func TestWaitingWriterKeepsItsMarkFresh(t *testing.T) {
	b := memlock.NewBackend()
	ttl := time.Second
	reader, _ := newRecorder(t, b, &dlock.Options{TTL: ttl})
	writer, rec := newRecorder(t, b, &dlock.Options{TTL: ttl})
	lr, err := reader.NewRWMutex("rw", nil).TryRLock(context.Background())
	if err != nil {
		t.Fatalf("TryRLock: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*ttl)
	defer cancel()
	if _, err := writer.NewRWMutex("rw", nil).Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock while a reader holds = %v, want DeadlineExceeded", err)
	}
	rec.mu.Lock()
	n := len(rec.attempts)
	rec.mu.Unlock()
	// Every TTL/3 over 3 TTLs is about 10 attempts; RetryAfter alone gives 3 to 5.
	if n < 7 {
		t.Fatalf("%d refused waiting-writer attempts in %v (TTL %v); want one at least every TTL/3", n, 3*ttl, ttl)
	}
	_ = lr.Unlock(context.Background())
}

// TestWaitingFlag: AcquireRequest.Waiting is set on the attempts of a
// waiting Lock of a mutex or a write lock, never on a TryLock, a read lock
// or a semaphore; a mutex waiter that gives up is not withdrawn (it leaves
// no mark).
func TestWaitingFlag(t *testing.T) {
	b := memlock.NewBackend()
	c, rec := newRecorder(t, b, &dlock.Options{TTL: time.Second})
	ctx := context.Background()
	rw := c.NewRWMutex("rw", nil)
	m := c.NewMutex("m", nil)
	for _, f := range []func(context.Context) (*dlock.Lease, error){rw.TryRLock, rw.TryLock, rw.RLock, c.NewSemaphore("s", 1, nil).Acquire, m.TryLock, m.Lock, rw.Lock} {
		l, err := f(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Unlock(ctx)
	}
	held, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.NewMutex("m", nil).Lock(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of a held mutex = %v, want DeadlineExceeded", err)
	}
	_ = held.Unlock(ctx)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var kinds []string
	for i, r := range rec.reqs {
		kinds = append(kinds, r.Kind.String())
		if want := i >= 5; r.Waiting != want {
			t.Fatalf("request %d (%s) Waiting = %v, want %v: only waiting Locks of mutexes and writes set it", i, r.Kind, r.Waiting, want)
		}
	}
	if want := []string{"read", "write", "read", "permit", "mutex", "mutex", "write", "mutex", "mutex"}; len(kinds) < len(want) || !slices.Equal(kinds[:len(want)], want) {
		t.Fatalf("request kinds %v, want %v then the refused waiter's attempts", kinds, want)
	}
	if len(rec.withdrawn) != 0 {
		t.Fatalf("withdrawn %v: a mutex waiter leaves no mark to withdraw", rec.withdrawn)
	}
	if rec.reqs[3].Permits != 1 {
		t.Fatalf("semaphore request Permits = %d, want 1", rec.reqs[3].Permits)
	}
	if len(rec.withdrawn) != 0 {
		t.Fatalf("Withdraw called %d times for grants", len(rec.withdrawn))
	}
}

func TestGivingUpWriterWithdrawsOnce(t *testing.T) {
	b := memlock.NewBackend()
	reader, _ := newRecorder(t, b, &dlock.Options{TTL: 10 * time.Second})
	writer, rec := newRecorder(t, b, &dlock.Options{TTL: 10 * time.Second})
	lr, err := reader.NewRWMutex("rw", nil).TryRLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := writer.NewRWMutex("rw", nil).Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v, want DeadlineExceeded", err)
	}
	rec.mu.Lock()
	withdrawn, last := slices.Clone(rec.withdrawn), rec.reqs[len(rec.reqs)-1]
	rec.mu.Unlock()
	if len(withdrawn) != 1 || withdrawn[0].Owner != last.Owner || withdrawn[0].Kind != driver.Write || withdrawn[0].Name != "rw" {
		t.Fatalf("Withdraw calls %+v; want one, for the waiting write request %+v", withdrawn, last)
	}
	// The withdrawn writer no longer holds readers back (its mark would
	// otherwise last its 10s TTL).
	l2, err := reader.NewRWMutex("rw", nil).TryRLock(context.Background())
	if err != nil {
		t.Fatalf("TryRLock after the writer gave up: %v", err)
	}
	_ = l2.Unlock(context.Background())
	_ = lr.Unlock(context.Background())
}

func TestRenewAndReleaseCarryKind(t *testing.T) {
	b := memlock.NewBackend()
	c, rec := newRecorder(t, b, &dlock.Options{TTL: 300 * time.Millisecond})
	ctx := context.Background()
	var leases []*dlock.Lease
	for _, f := range []func(context.Context) (*dlock.Lease, error){
		c.NewMutex("x", nil).TryLock, c.NewRWMutex("x", nil).TryRLock, c.NewRWMutex("y", nil).TryLock, c.NewSemaphore("x", 4, nil).TryAcquire,
	} {
		l, err := f(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	// Renewals keep every kind alive, in mixed batches.
	eventually(t, 10*time.Second, "a renewal batch with every kind", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, batch := range rec.renewed {
			seen := map[driver.Kind]int{}
			for _, l := range batch {
				seen[l.Kind] = l.Permits
			}
			if len(seen) == 4 && seen[driver.Permit] == 4 {
				return true
			}
		}
		return false
	})
	for _, l := range leases {
		if l.Err() != nil {
			t.Fatalf("%s lease ended: %v", l.Kind(), l.Err())
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("%s Unlock: %v", l.Kind(), err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var kinds []driver.Kind
	for _, l := range rec.released {
		kinds = append(kinds, l.Kind)
	}
	if want := []driver.Kind{driver.Exclusive, driver.Read, driver.Write, driver.Permit}; !slices.Equal(kinds, want) {
		t.Fatalf("released kinds %v, want %v", kinds, want)
	}
}

func TestMultiMutexUsesMultiAcquirer(t *testing.T) {
	b := memlock.NewBackend()
	c, rec := newRecorder(t, b, nil)
	ctx := context.Background()
	ml, err := c.NewMultiMutex([]string{"c", "a", "b"}, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	multi, single := rec.multi, len(rec.reqs)
	rec.mu.Unlock()
	if multi != 1 || single != 0 {
		t.Fatalf("TryAcquireMulti calls %d, TryAcquire calls %d; want 1 and 0", multi, single)
	}
	for _, n := range []string{"a", "b", "c"} {
		if o, _ := b.Holder(n); o == "" {
			t.Fatalf("%q not held", n)
		}
	}
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A set the driver cannot take atomically is taken one by one.
	rec.mu.Lock()
	rec.multiErr = driver.ErrUnsupported
	rec.mu.Unlock()
	ml, err = c.NewMultiMutex([]string{"c", "a", "b"}, nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with the multi-acquire unsupported: %v", err)
	}
	rec.mu.Lock()
	var names []string
	for _, r := range rec.reqs {
		names = append(names, r.Name)
	}
	rec.mu.Unlock()
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("one-by-one order %v, want the sorted names", names)
	}
	_ = ml.Unlock(ctx)
}

// TestMultiMutexUnknownOutcomeLeavesNothing: a multi-acquire whose reply
// was lost is undone name by name.
func TestMultiMutexUnknownOutcomeLeavesNothing(t *testing.T) {
	b := memlock.NewBackend()
	c, rec := newRecorder(t, b, nil)
	rec.LoseReplies(func(op string) error {
		if op == "acquire" {
			return errors.New("reply lost")
		}
		return nil
	})
	if _, err := c.NewMultiMutex([]string{"a", "b"}, nil).TryLock(context.Background()); err == nil || errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock with a lost reply = %v, want a backend error", err)
	}
	for _, n := range []string{"a", "b"} {
		if o, _ := b.Holder(n); o != "" {
			t.Fatalf("%q left held by %s after a lost reply", n, o)
		}
	}
}

func TestMultiMutexTryLockOneByOneLeavesNothing(t *testing.T) {
	b := memlock.NewBackend()
	c := dlock.New(plainDriver{b.NewDriver()}, nil)
	defer c.Close()
	other, _ := newRecorder(t, b, nil)
	lc, err := other.NewMutex("c", nil).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.NewMultiMutex([]string{"c", "a", "b"}, nil).TryLock(context.Background())
	if !errors.Is(err, dlock.ErrLocked) || !strings.Contains(err.Error(), `"c"`) {
		t.Fatalf("TryLock = %v, want ErrLocked naming \"c\"", err)
	}
	for _, n := range []string{"a", "b"} {
		if o, _ := b.Holder(n); o != "" {
			t.Fatalf("%q left held after a refused TryLock", n)
		}
	}
	_ = lc.Unlock(context.Background())
}

func TestInspectShowsKinds(t *testing.T) {
	c, _ := newMem(t, nil)
	ctx := context.Background()
	r1, _ := c.NewRWMutex("k", nil).TryRLock(ctx)
	r2, _ := c.NewRWMutex("k", nil).TryRLock(ctx)
	p1, _ := c.NewSemaphore("k", 5, nil).TryAcquire(ctx)
	m1, _ := c.NewMutex("k", nil).TryLock(ctx)
	infos, err := c.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 3 {
		t.Fatalf("Inspect = %+v, want the mutex, the read/write lock and the semaphore of k", infos)
	}
	if i := infos[0]; i.Kind != driver.Exclusive || i.Owner != m1.Owner() {
		t.Fatalf("mutex info %+v", i)
	}
	if i := infos[1]; i.Kind != driver.Write || i.Readers != 2 || i.Owner != "" || i.Token != r2.Token() {
		t.Fatalf("read/write info %+v, want 2 readers and token %d", i, r2.Token())
	}
	if i := infos[2]; i.Kind != driver.Permit || i.Permits != 5 || i.Holders != 1 || i.Token != p1.Token() {
		t.Fatalf("semaphore info %+v, want 1 of 5 permits", i)
	}
	for _, l := range []*dlock.Lease{r1, r2, p1, m1} {
		_ = l.Unlock(ctx)
	}
}

func TestMultiLeaseEndsWithItsClient(t *testing.T) {
	c, _ := newMem(t, nil)
	ml, err := c.NewMultiMutex([]string{"a", "b"}, nil).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	select {
	case <-ml.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("MultiLease not ended by Close")
	}
	if !errors.Is(ml.Err(), dlock.ErrClosed) {
		t.Fatalf("Err after Close = %v, want ErrClosed", ml.Err())
	}
}
