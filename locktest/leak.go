package locktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// settleWithin is how long the process may take, after Close returned, to
// let go of the goroutines and sockets a driver used (a client library's
// reader goroutine noticing its closed connection, say).
const settleWithin = 10 * time.Second

// poll checks cond every few milliseconds until it holds or within passes;
// it reports whether cond held.
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		t := time.NewTimer(5 * time.Millisecond) // the polling interval
		<-t.C
	}
	return true
}

// steady returns the goroutine and socket counts once they have stopped
// falling (what earlier subtests and the warm-up closed may take a moment to
// go), so that the baseline is not inflated by them.
func steady() (goroutines, sockets int) {
	goroutines = runtime.NumGoroutine()
	sockets, _ = openSockets()
	same := 0
	poll(settleWithin, func() bool {
		g := runtime.NumGoroutine()
		n, _ := openSockets()
		if g < goroutines || n < sockets {
			goroutines, sockets, same = min(g, goroutines), min(n, sockets), 0
			return false
		}
		same++
		return same >= 40 // unchanged for about 200ms
	})
	return goroutines, sockets
}

// openSockets counts the process's open file descriptors that are sockets
// (Linux /proc/self/fd); ok is false where that cannot be read.
func openSockets() (n int, ok bool) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n, true
}

// testNoLeaks checks that a Client's Close leaves no connection, goroutine
// or socket behind, whatever the Client did before: locks taken, renewed,
// waited for, handed off, re-entered, extended, released, left held at
// Close, and a wait cancelled.
func (s *suite) testNoLeaks(t *testing.T) {
	if _, ok := openSockets(); !ok {
		t.Skip("cannot count sockets on this platform (no /proc/self/fd)")
	}
	// Warm up once, so that whatever the harness or a client library sets
	// up once per process (a shared pool, a resolver) is not counted.
	s.leakWorkload(t, true)
	goroutines, sockets := steady()

	s.leakWorkload(t, false)

	settled := poll(settleWithin, func() bool {
		n, _ := openSockets()
		return n <= sockets && runtime.NumGoroutine() <= goroutines
	})
	if settled {
		return
	}
	nowSockets, _ := openSockets()
	nowGoroutines := runtime.NumGoroutine()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	t.Errorf("after Close (waited %v): %d sockets (before Open: %d), %d goroutines (before: %d)\n%s",
		settleWithin, nowSockets, sockets, nowGoroutines, goroutines, dlockGoroutines(buf))
}

// dlockGoroutines drops the test runner's own goroutines from a dump.
func dlockGoroutines(dump []byte) string {
	var keep [][]byte
	for _, g := range bytes.Split(dump, []byte("\n\n")) {
		if bytes.Contains(g, []byte(" [running]:")) || bytes.Contains(g, []byte("testing.(*T).Run(")) ||
			bytes.Contains(g, []byte("testing.(*M).")) || bytes.Contains(g, []byte("testing.runTests")) {
			continue
		}
		keep = append(keep, g)
	}
	return string(bytes.Join(keep, []byte("\n\n")))
}

// leakWorkload opens two clients, puts them through a bit of everything and
// closes them. warmup does only the minimum.
func (s *suite) leakWorkload(t *testing.T, warmup bool) {
	ttl := s.ttl()
	open := func() *dlock.Client {
		d, err := s.h.NewDriver(context.Background())
		if err != nil {
			t.Fatalf("NewDriver: %v", err)
		}
		return dlock.New(d, &dlock.Options{TTL: ttl, WaitMax: 50 * time.Millisecond})
	}
	a, b := open(), open()
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	defer closeAll()
	name := uniqueName(t)
	start := time.Now()
	la := mustTry(t, a.NewMutex(name, nil))
	if warmup {
		if err := la.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		closeAll()
		return
	}

	// A waiter queues or subscribes behind the holder.
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*ttl+10*time.Second)
		defer cancel()
		l, err := b.NewMutex(name, nil).Lock(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	// A waiter that gives up.
	ctx, cancel := context.WithTimeout(context.Background(), ttl/4)
	if _, err := b.NewMutex(name, nil).Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		cancel()
		t.Fatalf("cancelled Lock on a held lock = %v, want DeadlineExceeded", err)
	}
	cancel()
	// The holder is renewed at least once.
	renewed := poll(5*ttl+5*time.Second, func() bool {
		since := time.Since(start)
		return since > ttl/2 && la.ValidFor() > ttl-since+ttl/20
	})
	if !renewed {
		t.Fatalf("lease not renewed within %v (ValidFor %v)", 5*ttl+5*time.Second, la.ValidFor())
	}
	if err := la.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	var lb *dlock.Lease
	select {
	case lb = <-got:
	case err := <-errc:
		t.Fatalf("waiting Lock: %v", err)
	case <-time.After(20*ttl + 10*time.Second):
		t.Fatal("the waiter never got the released lock")
	}
	if !s.cfg.SessionBound {
		if err := lb.Extend(context.Background(), 2*ttl); err != nil {
			t.Fatalf("Extend: %v", err)
		}
	}
	if err := lb.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}

	// Re-entrance with an explicit owner.
	opts := &dlock.MutexOptions{Owner: "locktest-leak-" + name[len(name)-8:]}
	l1 := mustTry(t, a.NewMutex(name+"/r", opts))
	l2 := mustTry(t, a.NewMutex(name+"/r", opts))
	for _, l := range []*dlock.Lease{l2, l1} {
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock of a re-entered hold: %v", err)
		}
	}
	if _, err := a.Inspect(context.Background(), name); err != nil && !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Inspect: %v", err)
	}
	if err := a.Do(context.Background(), name+"/do", nil, func(context.Context, *dlock.Lease) error { return nil }); err != nil {
		t.Fatalf("Do: %v", err)
	}

	// Leases still held at Close: Close releases them.
	var held []*dlock.Lease
	for i := 0; i < 3; i++ {
		held = append(held, mustTry(t, a.NewMutex(fmt.Sprintf("%s/held-%d", name, i), nil)))
	}
	held = append(held, mustTry(t, b.NewMutex(name, nil)))
	closeAll()
	for _, l := range held {
		within(t, l.Done(), time.Second, "Done after Close")
	}
}
