package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/dlock/dlock/driver"
)

// listener is the driver's one LISTEN connection. Every release sends
// NOTIFY on the channel <table>_release with the lock's name as payload; the
// listener fans it out to the local subscriptions for that name. The
// connection is opened outside the pool (so it never takes a slot from the
// user's pool) on the first Subscribe, and reopened with backoff if it
// fails; every subscriber is woken on a reconnect, because a release may
// have been missed while it was down.
//
// A release NOTIFYs only when someone waits for the name (see WaitKey):
// the listener marks every name it has subscribers for with a shared
// advisory lock on the name's WaitKey, held by the LISTEN session, and a
// release statement tries the same key exclusively (pg_try_advisory_xact_lock,
// held to its commit) after giving the lock up, and NOTIFYs only if that
// fails. A mark taken while a release's exclusive try holds the key waits
// for that release to commit, so the waiter's next attempt, made once
// Subscribe has returned, sees the lock free; a mark in place before the
// try makes the release NOTIFY. Either way no release is missed.
type listener struct {
	d *Driver

	mu       sync.Mutex
	seq      uint64 // the last subscription's seq
	subs     map[string]map[*subscription]struct{}
	marks    map[string]*mark // the names marked, or to mark, on the LISTEN session
	started  bool
	closed   bool
	up       bool
	firstTry chan struct{} // closed after the first connection attempt
	firstErr error
	pid      uint32             // backend PID of the current LISTEN connection, 0 when down
	kick     context.CancelFunc // interrupts the listener's wait for a notification; nil when not waiting
	changed  chan struct{}      // closed and replaced when marks were synced or the connection came up or went down
	cancel   context.CancelFunc
	done     chan struct{}
}

// mark is a name's waiter mark on the LISTEN session.
type mark struct {
	key  int64     // WaitKey of the name
	held bool      // the shared lock is held on the current LISTEN session
	idle time.Time // when the name's last subscriber left; zero while it has some
}

// markLinger is how long a name stays marked after its last subscriber
// left: a hot lock's waiters come and go, and a stale mark costs at most a
// NOTIFY nobody needs, while unmarking and marking again costs the LISTEN
// session a statement each time.
const markLinger = 2 * time.Second

// markTimeout bounds one statement that marks or unmarks names. A mark
// waits only for a release statement's commit, so running out means the
// session is in trouble: the connection is dropped and made again.
const markTimeout = 10 * time.Second

// WaitKey returns the advisory key that marks name as waited for: a
// driver's LISTEN session holds it shared while it has subscribers for
// name, and a release NOTIFYs only when it cannot take it exclusively.
// It is AdvisoryKey of "\x00wait\x00" + name, which no lock name's
// AdvisoryKey or RWKey equals.
func WaitKey(name string) int64 { return AdvisoryKey("\x00wait\x00" + name) }

func newListener(d *Driver) *listener {
	return &listener{d: d, subs: map[string]map[*subscription]struct{}{}, marks: map[string]*mark{},
		firstTry: make(chan struct{}), changed: make(chan struct{}), done: make(chan struct{})}
}

// changedLocked wakes everyone waiting for a change of the listener's
// state; l.mu is held.
func (l *listener) changedLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Subscribe implements driver.Notifier. It returns once the driver's LISTEN
// is in place and the LISTEN session marks name as waited for (see
// WaitKey), so a release after Subscribe returns is never missed (a release
// while the listener is reconnecting wakes every subscriber).
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
	mk := l.marks[name]
	if mk == nil {
		mk = &mark{key: WaitKey(name)}
		l.marks[name] = mk
	}
	mk.idle = time.Time{}
	if !mk.held && l.kick != nil {
		l.kick()
	}
	l.mu.Unlock()
	for {
		l.mu.Lock()
		up, held, changed, err := l.up, mk.held, l.changed, l.firstErr
		l.mu.Unlock()
		if up && held {
			return s, nil
		}
		first := l.firstTry
		if !up {
			select {
			case <-first:
				// Down after the first attempt: failed from the start, or
				// reconnecting.
				if err != nil {
					s.Close()
					return nil, fmt.Errorf("pglock: subscribe: %w", err)
				}
				s.wake() // reconnecting: make the caller poll once
				return s, nil
			default:
			}
		} else {
			first = nil
		}
		select {
		case <-changed:
		case <-first:
		case <-ctx.Done():
			s.Close()
			return nil, fmt.Errorf("pglock: subscribe: %w", ctx.Err())
		}
	}
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := 50 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		err := l.listenOnce(ctx, func() {
			l.mu.Lock()
			l.up = true
			l.changedLocked()
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
		// The session's marks ended with it: the next connection takes
		// them again before it counts as up.
		for _, mk := range l.marks {
			mk.held = false
		}
		l.changedLocked()
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
	// The wait for a notification is interrupted to mark names (see
	// Subscribe): by a read deadline, which leaves the connection usable,
	// not by a cancel request, which could cancel the marking statement.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
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
	if _, err := l.syncMarks(ctx, conn); err != nil {
		return err
	}
	onUp()
	l.mu.Lock()
	l.pid = conn.PgConn().PID()
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.pid = 0
		l.kick = nil
		l.mu.Unlock()
	}()
	for {
		next, err := l.syncMarks(ctx, conn)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithCancel(ctx)
		if !next.IsZero() {
			cancel()
			wctx, cancel = context.WithDeadline(ctx, next)
		}
		l.mu.Lock()
		pending := l.pendingLocked()
		if !pending {
			l.kick = cancel
		}
		l.mu.Unlock()
		if pending {
			cancel()
			continue
		}
		n, err := conn.WaitForNotification(wctx)
		l.mu.Lock()
		l.kick = nil
		l.mu.Unlock()
		cancel()
		if err != nil {
			if ctx.Err() == nil && wctx.Err() != nil && !conn.IsClosed() {
				continue // interrupted to mark or unmark names
			}
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

// pendingLocked reports whether a name waits to be marked on the LISTEN
// session; l.mu is held.
func (l *listener) pendingLocked() bool {
	for _, mk := range l.marks {
		if !mk.held && mk.idle.IsZero() {
			return true
		}
	}
	return false
}

// syncMarks brings the LISTEN session's marks in line with the names that
// have subscribers: it marks those not yet marked, unmarks those whose last
// subscriber left more than markLinger ago, and tells Subscribe. It returns
// when the next lingering mark is due to go (zero if none).
func (l *listener) syncMarks(ctx context.Context, conn *pgx.Conn) (time.Time, error) {
	now := time.Now()
	var add, drop []int64
	var next time.Time
	l.mu.Lock()
	for name, mk := range l.marks {
		switch {
		case mk.idle.IsZero():
			if !mk.held {
				add = append(add, mk.key)
			}
		case now.Sub(mk.idle) >= markLinger:
			if mk.held {
				drop = append(drop, mk.key)
			}
			delete(l.marks, name)
		case mk.held:
			if due := mk.idle.Add(markLinger); next.IsZero() || due.Before(next) {
				next = due
			}
		default:
			delete(l.marks, name) // never marked: nothing to undo
		}
	}
	l.mu.Unlock()
	if len(add) == 0 && len(drop) == 0 {
		return next, nil
	}
	sctx, cancel := context.WithTimeout(ctx, markTimeout)
	defer cancel()
	_, err := conn.Exec(sctx, `SELECT (SELECT count(pg_advisory_lock_shared(k)) FROM unnest($1::bigint[]) AS k),
	(SELECT count(pg_advisory_unlock_shared(k)) FROM unnest($2::bigint[]) AS k)`, add, drop)
	if err != nil {
		return next, fmt.Errorf("pglock: marking waited-for names on the LISTEN session: %w", err)
	}
	l.mu.Lock()
	added := make(map[int64]bool, len(add))
	for _, k := range add {
		added[k] = true
	}
	for _, mk := range l.marks {
		if added[mk.key] {
			mk.held = true
		}
	}
	l.changedLocked()
	l.mu.Unlock()
	return next, nil
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
				// The name stays marked for markLinger; the listener
				// unmarks it then.
				if mk := s.l.marks[s.name]; mk != nil {
					mk.idle = time.Now()
					if s.l.kick != nil {
						s.l.kick()
					}
				}
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
