package sqlcommon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
)

// Wake-up signals for backends without notification (MySQL, SQLite). A
// holder keeps a companion signal (a GET_LOCK name, a byte lock on a file)
// while it holds a lock; a waiter blocks until the signal is free and then
// tries the lock. The grant itself stays the backend's atomic statement: a
// wake only says "try now", so a missed or spurious one costs latency,
// never safety.

// Outcome is what one Waiter.Wait saw.
type Outcome int

const (
	// Released: a holder kept the signal and has let it go (released, or
	// its session or process ended). The first subscriber is woken at once.
	Released Outcome = iota
	// NoHolder: nobody kept the signal: the lock is free, about to be
	// taken, or held by a holder that does not signal (crashed, older
	// code). The first subscriber is woken on a backoff (2ms doubling to
	// 1s), so such a lock is polled as before.
	NoHolder
	// StillHeld: the wait ran out with the holder still signalling; it is
	// simply made again.
	StillHeld
)

// Waiter waits on one lock name's signal for a Watches.
type Waiter interface {
	// Wait checks whether a holder keeps the signal and, if one does,
	// waits until it lets go, ctx ends or a time of the Waiter's choosing
	// passes. It must not keep the signal itself past its return.
	Wait(ctx context.Context) (Outcome, error)
	// Close frees what the Waiter holds (a connection, a file).
	Close()
}

// Watches implements driver.Notifier over Waiters: one Waiter and one
// goroutine per name with subscribers, shared by them all, waking the
// longest-waiting subscriber first. All methods are safe for concurrent
// use. The zero value is not usable; use NewWatches.
type Watches struct {
	open  func(ctx context.Context, name string) (Waiter, error)
	limit func() int // most names watched at once; 0 for no limit

	ctx    context.Context // ends with Close
	cancel context.CancelFunc

	mu      sync.Mutex
	watches map[string]*watch
	closed  bool
	wg      sync.WaitGroup
}

// NewWatches returns a Watches whose Waiters open makes. limit, if not
// nil, bounds the names watched at once (a Waiter may hold a pooled
// connection for as long as its name is watched); beyond it, and for a
// result of 0 without bound, Subscribe fails and the caller polls.
func NewWatches(open func(ctx context.Context, name string) (Waiter, error), limit func() int) *Watches {
	ctx, cancel := context.WithCancel(context.Background())
	if limit == nil {
		limit = func() int { return 0 }
	}
	return &Watches{open: open, limit: limit, ctx: ctx, cancel: cancel, watches: map[string]*watch{}}
}

// errClosed is Subscribe's error after Close.
var errClosed = errors.New("driver is closed")

// Subscribe implements driver.Notifier. A name's Waiter is opened outside
// the lock, so a slow open delays no other name's wake-ups.
func (ws *Watches) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	ws.mu.Lock()
	if sub, ok, err := ws.join(name); ok || err != nil {
		ws.mu.Unlock()
		return sub, err
	}
	if n := ws.limit(); n > 0 && len(ws.watches) >= n {
		ws.mu.Unlock()
		return nil, fmt.Errorf("%d lock names watched already, the most for this pool", n)
	}
	ws.mu.Unlock()
	wt, err := ws.open(ctx, name)
	if err != nil {
		return nil, err
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if sub, ok, err := ws.join(name); ok || err != nil {
		wt.Close() // another subscriber opened one meanwhile, or closed
		return sub, err
	}
	w := &watch{ws: ws, name: name, w: wt, idle: make(chan struct{}, 1)}
	ws.watches[name] = w
	ws.wg.Add(1)
	go w.run()
	return w.add(), nil
}

// join adds a subscriber to name's watch if there is one (ok); ws.mu is
// held.
func (ws *Watches) join(name string) (driver.Subscription, bool, error) {
	if ws.closed {
		return nil, false, errClosed
	}
	if w := ws.watches[name]; w != nil {
		return w.add(), true, nil
	}
	return nil, false, nil
}

// add adds a subscriber; ws.mu is held.
func (w *watch) add() driver.Subscription {
	sub := &subscription{w: w, c: make(chan struct{}, 1)}
	w.subs = append(w.subs, sub)
	return sub
}

// Watching reports whether name has a watch (subscribers now, or a wait
// still under way): a sign that the lock is contended.
func (ws *Watches) Watching(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.watches[name] != nil
}

// WakeAll wakes every subscriber of name in this process. A driver calls
// it when it grants a shared hold (a read lock) of a name it has waiters
// for: a release wakes only the longest waiter, and once that one was
// granted a read, the others may be granted one too.
func (ws *Watches) WakeAll(name string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w := ws.watches[name]; w != nil {
		for _, s := range w.subs {
			s.wake()
		}
	}
}

// Close stops every watch and waits for their goroutines when wait is
// true. A Waiter whose Wait cannot be interrupted (a kernel file lock)
// ends when its signal is next free; pass wait false for those.
func (ws *Watches) Close(wait bool) {
	ws.mu.Lock()
	ws.closed = true
	ws.mu.Unlock()
	ws.cancel()
	if wait {
		ws.wg.Wait()
	}
}

type watch struct {
	ws   *Watches
	name string
	w    Waiter
	idle chan struct{} // signalled when the last subscriber leaves
	subs []*subscription
}

func (w *watch) run() {
	defer w.ws.wg.Done()
	defer w.w.Close()
	ctx := w.ws.ctx
	backoff := 2 * time.Millisecond
	for {
		o, err := w.w.Wait(ctx)
		if err != nil || ctx.Err() != nil {
			w.end()
			return
		}
		switch o {
		case Released:
			backoff = 2 * time.Millisecond
		case NoHolder:
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
			case <-w.idle:
			case <-t.C:
			}
			t.Stop()
			backoff = min(backoff*2, time.Second)
		}
		if !w.wakeFirst(o != StillHeld) {
			return
		}
	}
}

// wakeFirst wakes the longest-waiting subscriber when wake is true; false
// (and the watch is removed) when there is no subscriber left or the
// Watches closed.
func (w *watch) wakeFirst(wake bool) bool {
	ws := w.ws
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed || len(w.subs) == 0 {
		delete(ws.watches, w.name)
		return false
	}
	if wake {
		w.subs[0].wake()
	}
	return true
}

// end removes the watch after its Waiter failed: every subscriber gets one
// last wake, and then polls.
func (w *watch) end() {
	ws := w.ws
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.watches[w.name] == w {
		delete(ws.watches, w.name)
	}
	for _, s := range w.subs {
		s.wake()
	}
	w.subs = nil
}

type subscription struct {
	w    *watch
	c    chan struct{}
	once sync.Once
}

func (s *subscription) C() <-chan struct{} { return s.c }

func (s *subscription) wake() {
	select {
	case s.c <- struct{}{}:
	default:
	}
}

// Close stops the subscription; an unconsumed wake passes to the next
// subscriber. It is idempotent.
func (s *subscription) Close() error {
	s.once.Do(func() {
		w := s.w
		w.ws.mu.Lock()
		defer w.ws.mu.Unlock()
		for i, x := range w.subs {
			if x == s {
				w.subs = append(w.subs[:i], w.subs[i+1:]...)
				break
			}
		}
		if len(w.subs) == 0 {
			select {
			case w.idle <- struct{}{}:
			default:
			}
			return
		}
		select {
		case <-s.c:
			w.subs[0].wake()
		default:
		}
	})
	return nil
}
