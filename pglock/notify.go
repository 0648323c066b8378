package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock/driver"
)

// listener is the driver's one LISTEN connection. Every release sends
// NOTIFY on the channel <table>_release with the lock's name as payload; the
// listener fans it out to the local subscriptions for that name. The
// connection is opened outside the pool (so it never takes a slot from the
// user's pool) on the first Subscribe, and reopened with backoff if it
// fails; every subscriber is woken on a reconnect, because a release may
// have been missed while it was down.
type listener struct {
	d *Driver

	mu       sync.Mutex
	seq      uint64 // the last subscription's seq
	subs     map[string]map[*subscription]struct{}
	started  bool
	closed   bool
	up       bool
	firstTry chan struct{} // closed after the first connection attempt
	firstErr error
	pid      uint32 // backend PID of the current LISTEN connection, 0 when down
	cancel   context.CancelFunc
	done     chan struct{}
}

func newListener(d *Driver) *listener {
	return &listener{d: d, subs: map[string]map[*subscription]struct{}{}, firstTry: make(chan struct{}), done: make(chan struct{})}
}

// Subscribe implements driver.Notifier. It returns once the driver's LISTEN
// is in place, so a release after Subscribe returns is never missed (a
// release while the listener is reconnecting wakes every subscriber).
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	if err := d.base.Check(); err != nil {
		return nil, err
	}
	l := d.ln
	s := &subscription{l: l, name: name, c: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errors.New("pglock: driver is closed")
	}
	if !l.started {
		l.started = true
		runCtx, cancel := context.WithCancel(context.Background())
		l.cancel = cancel
		go l.run(runCtx)
	}
	m := l.subs[name]
	if m == nil {
		m = map[*subscription]struct{}{}
		l.subs[name] = m
	}
	l.seq++
	s.seq = l.seq
	m[s] = struct{}{}
	up := l.up
	l.mu.Unlock()
	if !up {
		select {
		case <-l.firstTry:
			l.mu.Lock()
			err, up := l.firstErr, l.up
			l.mu.Unlock()
			if err != nil && !up {
				s.Close()
				return nil, fmt.Errorf("pglock: subscribe: %w", err)
			}
			if !up {
				s.wake() // reconnecting: make the caller poll once
			}
		case <-ctx.Done():
			s.Close()
			return nil, fmt.Errorf("pglock: subscribe: %w", ctx.Err())
		}
	}
	return s, nil
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := 50 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		err := l.listenOnce(ctx, func() {
			l.mu.Lock()
			l.up = true
			l.mu.Unlock()
			if first {
				first = false
				close(l.firstTry)
			}
			backoff = 50 * time.Millisecond
			l.wakeAll()
		})
		l.mu.Lock()
		l.up = false
		if first {
			l.firstErr = err
		}
		l.mu.Unlock()
		if first {
			first = false
			close(l.firstTry)
		}
		l.wakeAll()
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// listenOnce connects, LISTENs, calls onUp and dispatches notifications
// until the connection fails or ctx ends.
func (l *listener) listenOnce(ctx context.Context, onUp func()) error {
	// Connect the way the pool does (its BeforeConnect and AfterConnect
	// hooks included, for rotating credentials and session setup), but
	// outside it, so the listener never takes one of its connections.
	pcfg := l.d.pool.Config()
	cfg := pcfg.ConnConfig.Copy()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if pcfg.BeforeConnect != nil {
		if err := pcfg.BeforeConnect(cctx, cfg); err != nil {
			return err
		}
	}
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	if pcfg.AfterConnect != nil {
		if err := pcfg.AfterConnect(cctx, conn); err != nil {
			_ = conn.Close(cctx)
			return err
		}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(l.d.channel)); err != nil {
		return err
	}
	onUp()
	l.mu.Lock()
	l.pid = conn.PgConn().PID()
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.pid = 0
		l.mu.Unlock()
	}()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.mu.Lock()
		if name, ok := strings.CutPrefix(n.Payload, wakeAllPrefix); ok {
			for s := range l.subs[name] {
				s.wake()
			}
		} else {
			l.wakeOne(n.Payload)
		}
		l.mu.Unlock()
	}
}

// wakeOne wakes the longest-waiting local subscriber of name that has no
// wake pending: only one waiter per process can take a freed lock, so
// waking the rest would only make them race and go back to sleep, and
// waking the oldest first keeps a waiter from being passed over again and
// again. A subscriber that closes with its wake unconsumed passes it on
// (see subscription.Close). l.mu is held.
func (l *listener) wakeOne(name string) {
	var first *subscription
	for s := range l.subs[name] {
		if len(s.c) == 0 && (first == nil || s.seq < first.seq) {
			first = s
		}
	}
	if first != nil {
		first.wake()
	}
}

func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.subs {
		for s := range m {
			s.wake()
		}
	}
}

func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	started := l.started
	cancel := l.cancel
	l.mu.Unlock()
	if started {
		cancel()
		<-l.done
	}
}

type subscription struct {
	l    *listener
	seq  uint64 // order of subscription: lower waited longer
	name string
	c    chan struct{}
	once sync.Once
}

func (s *subscription) C() <-chan struct{} { return s.c }

// wake signals s; false if a signal was already pending.
func (s *subscription) wake() bool {
	select {
	case s.c <- struct{}{}:
		return true
	default:
		return false
	}
}

// Close stops the subscription. It is idempotent.
func (s *subscription) Close() error {
	s.once.Do(func() {
		s.l.mu.Lock()
		if m := s.l.subs[s.name]; m != nil {
			delete(m, s)
			if len(m) == 0 {
				delete(s.l.subs, s.name)
			}
		}
		select {
		case <-s.c:
			// An unconsumed wake: the lock may be free and nobody else
			// here was told. Hand it on.
			s.l.wakeOne(s.name)
		default:
		}
		s.l.mu.Unlock()
	})
	return nil
}
