package dlock_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

type valKey string

// Lease.Context carries the values of the context Lock was called with,
// whatever cancel and timer layers were above or between them, though the
// lease keeps none of those layers (and they were cancelled when Lock
// returned).
func TestLeaseContextValuesUnderCancelLayers(t *testing.T) {
	c := dlock.New(memlock.NewBackend().NewDriver(), nil)
	defer c.Close()
	inner, cancelInner := context.WithCancel(context.WithValue(context.Background(), valKey("a"), "1"))
	v := context.WithValue(inner, valKey("b"), "2")
	ctx, cancel := context.WithTimeout(v, time.Minute)
	ctx, cancelCause := context.WithCancelCause(ctx)
	l, err := c.NewMutex("values", nil).Lock(ctx)
	cancelCause(nil)
	cancel()
	cancelInner()
	if err != nil {
		t.Fatal(err)
	}
	lc := l.Context()
	if lc.Value(valKey("a")) != "1" || lc.Value(valKey("b")) != "2" {
		t.Fatalf("Lease.Context values: a=%v b=%v, want 1 and 2", lc.Value(valKey("a")), lc.Value(valKey("b")))
	}
	if lc.Err() != nil {
		t.Fatalf("Lease.Context ended with Lock's context: %v", lc.Err())
	}
	if _, ok := lc.Deadline(); ok {
		t.Fatal("Lease.Context has Lock's deadline")
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-lc.Done()
	if context.Cause(lc) == nil || lc.Value(valKey("b")) != "2" {
		t.Fatalf("after Unlock: cause %v, b=%v", context.Cause(lc), lc.Value(valKey("b")))
	}
}

// heldPerLease holds n leases on memlock, each taken with a
// context.WithTimeout over root of its own, cancelled once Lock returns (as
// the peer comparison takes them), and returns the heap per held lease.
func heldPerLease(t *testing.T, root context.Context, name string) float64 {
	const n = 4000
	c := dlock.New(memlock.NewBackend().NewDriver(), nil)
	defer c.Close()
	names := heldNames(name, n)
	leases := make([]*dlock.Lease, n)
	before := heapInUse()
	for i, name := range names {
		ctx, cancel := context.WithTimeout(root, time.Minute)
		l, err := c.NewMutex(name, nil).Lock(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	b := float64(int64(heapInUse())-int64(before)) / n
	runtime.KeepAlive(leases)
	return b
}

// A held lease taken with a context of its own (context.WithTimeout,
// cancelled once Lock returns, as the peer comparison takes them) does not
// keep that context's timer layer alive: ≈220 B per lease when it did.
func TestHeldLeaseKeepsNoTimerContext(t *testing.T) {
	peeled := heldPerLease(t, context.Background(), "peeled")
	restore := dlock.KeepWholeContexts()
	whole := heldPerLease(t, context.Background(), "whole")
	restore()
	t.Logf("heap per held lease: %.0f B, %.0f B keeping the whole context", peeled, whole)
	if whole-peeled < 150 {
		t.Fatalf("a held lease costs %.0f B, only %.0f B less than keeping Lock's timer context whole (%.0f B)", peeled, whole-peeled, whole)
	}
}

// rootCtx stands for a program's root context that peeling does not reach,
// such as signal.NotifyContext's (the peer comparison's): it adds no value,
// but it is no cancel or timer layer of package context.
type rootCtx struct{ context.Context }

// Leases taken under such a root, which they all share, cost no more than
// under context.Background: the lease keeps the root in a field of its
// own, not in a side struct made for it (80 B more per lease when it did).
func TestHeldLeaseUnderSharedRoot(t *testing.T) {
	bg := heldPerLease(t, context.Background(), "background")
	root := heldPerLease(t, &rootCtx{context.Background()}, "root")
	t.Logf("heap per held lease: %.0f B under Background, %.0f B under a shared root", bg, root)
	if root-bg > 24 {
		t.Fatalf("a held lease under a shared root context costs %.0f B, %.0f B more than under Background (%.0f B)", root, root-bg, bg)
	}
}

// keyDriver reports each grant's key as prefix + name, as etcdlock,
// zklock and redislock name theirs.
type keyDriver struct{ *memlock.Driver }

func (d keyDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := d.Driver.TryAcquire(ctx, req)
	g.Key = "locks/" + req.Name + "/slot-0"
	return g, err
}

// A lease whose grant's key holds the lock's name keeps the name as a slice
// of that key, which it keeps anyway, not the caller's name string (≈48 B
// per held lease when the name was made for the Lock).
func TestLeaseNameSharesItsKey(t *testing.T) {
	c := dlock.New(keyDriver{memlock.NewBackend().NewDriver()}, nil)
	defer c.Close()
	name := fmt.Sprintf("orders/%d", 42)
	l, err := c.NewMutex(name, nil).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	if l.Name() != name || l.Key() != "locks/orders/42/slot-0" {
		t.Fatalf("Name %q, Key %q", l.Name(), l.Key())
	}
	if unsafe.StringData(l.Name()) != unsafe.StringData(l.Key()[len("locks/"):]) {
		t.Fatal("the lease keeps the caller's name string, not a slice of its key")
	}
}
