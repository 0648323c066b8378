package mysqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Wake-up signals. MySQL has no notification, so every lock name has a
// companion GET_LOCK name, its signal (SignalName), that the holder's
// session keeps while it holds the lock: in ModeGetLock the statement that
// takes the lock takes the signal too, in ModeRowLock the statement that
// confirms the grant does, and both release statements give it up. In
// ModeLease, whose statements run on any pooled connection, one connection
// per driver keeps the signals of the leases the driver has held for more
// than signalDelay, or at once when the lock is contended (the driver has
// waiters for it or was refused it in the last second): an uncontended lock
// released sooner costs nothing extra, and its waiters find it free on
// their first backoff, 2ms. The release of a lease whose signal was taken
// returns once the signal is given up (one more round trip), so waiters are
// woken before the releaser can take the lock again. A waiter blocks in GET_LOCK on
// the signal, which the server grants the moment the holder gives it up or
// its session ends, and gives it back at once in the same statement. The
// grant itself stays the lock's own atomic statement: a wake only says
// "try now".

// signalDelay is how long a lease is held before its driver takes its
// signal.
const signalDelay = 2 * time.Millisecond

// signalWaitSeconds bounds one blocking wait for a signal; the wait is then
// simply made again (short enough to stay under common read timeouts of
// drivers and proxies).
const signalWaitSeconds = "5"

// Subscribe implements driver.Notifier: the subscription is woken when the
// holder of name gives up its signal (it released, or its session ended),
// on a backoff (2ms doubling to 1s) while no holder keeps the signal (a
// lease released within signalDelay, a holder that crashed), and never
// otherwise. Within one driver the longest-waiting subscriber of a name is
// woken first. The driver's waiters for one name share one pooled
// connection, which waits in GET_LOCK; at most a quarter of the pool's
// connection limit is used this way (a waiter for a name beyond it polls),
// and a lease-mode driver whose pool allows fewer than 4 connections keeps
// no signals (its waiters are woken on the backoff).
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	if err := d.base.Check(); err != nil {
		return nil, err
	}
	sub, err := d.watches.Subscribe(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: subscribe: %w", err)
	}
	return sub, nil
}

// watchLimit bounds the names a driver watches at once, each on a pooled
// connection, to a quarter of the pool's limit (none when the pool has no
// limit), so that waiters never take the connections their own attempts
// need; a waiter beyond it polls.
func (s *store) watchLimit() int {
	if n := s.db.Stats().MaxOpenConnections; n > 0 {
		return max(n/4, 1)
	}
	return 0
}

// signalWaiter waits for one name's signal on a pooled connection.
type signalWaiter struct {
	conn *sql.Conn
	stmt string
}

func (s *store) openWaiter(ctx context.Context, name string) (sqlcommon.Waiter, error) {
	conn, err := poolWait(ctx, s, "mysqllock: subscribe: a connection to wait on", s.db.Conn)
	if err != nil {
		return nil, err
	}
	return &signalWaiter{conn: conn, stmt: fill(s.q.signalWait, "{W}", hexLit(SignalName(name)), "{WT}", signalWaitSeconds)}, nil
}

// Wait implements sqlcommon.Waiter. An ended ctx interrupts it by closing
// the connection, which ends the wait on the server.
func (w *signalWaiter) Wait(ctx context.Context) (sqlcommon.Outcome, error) {
	var held bool
	var got int
	if err := w.conn.QueryRowContext(ctx, w.stmt).Scan(&held, &got); err != nil {
		return 0, err
	}

	switch {
	case got != 1:
		return sqlcommon.StillHeld, nil
	case held:
		return sqlcommon.Released, nil
	}
	return sqlcommon.NoHolder, nil
}

// Close implements sqlcommon.Waiter.
func (w *signalWaiter) Close() { _ = w.conn.Close() }

// leaseSignals keeps, on one pooled connection, the signals of the leases a
// ModeLease driver holds: taken signalDelay after a grant, given up after
// the release, both by a goroutine that batches them into one statement,
// so a grant or a release never waits for them. All methods are safe for
// concurrent use.
type leaseSignals struct {
	st *store

	mu       sync.Mutex
	names    map[string]*leaseSignal
	refusals *refusals     // when this driver was last refused a name
	kick     chan struct{} // cap 1: there is work
	started  bool
	closed   bool
	cancel   context.CancelFunc
	done     chan struct{}
	// busyGets counts GET_LOCKs of a signal that met it held by another
	// session (for tests: the wait for a busy signal to be asked again).
	busyGets atomic.Int64

	// delayed lists the grants whose signal is to be taken signalDelay
	// after them, oldest first (so also by when), each checked against
	// its entry's due when its time comes (a release or a contended grant
	// meanwhile leaves it stale). One timer, armed for the oldest when it
	// is not armed already and left armed when a lease is released, takes
	// them: a time.AfterFunc per grant armed a runtime timer on every
	// uncontended acquire, which woke the Go netpoller.
	delayed []delayedSignal
	timer   sqlcommon.SharedTimer
}

// delayedSignal is one grant in leaseSignals.delayed: its entry, listed
// under key, and when its signal is due.
type delayedSignal struct {
	key string
	e   *leaseSignal
	due time.Duration // since signalEpoch
}

// signalEpoch is the origin of leaseSignal.due, read with the monotonic
// clock.
var signalEpoch = time.Now()

// leaseSignal is the state of one held lease's signal, kept for as long as
// the lease is held: it is kept small (48 B), and the GET_LOCK name of the
// signal is made only when a change is sent (see signalOf).
type leaseSignal struct {
	owner      string
	kind       driver.Kind // the holder's kind: its key is kindKey unless Exclusive
	want, have bool        // the signal should be / was last sent to be kept
	sending    bool        // a change is on its way to the server
	// due, when not 0, is when the signal is to be wanted (since
	// signalEpoch): the entry waits in leaseSignals.delayed until then.
	due time.Duration
	// gone, when not nil, is closed once the entry leaves (the signal
	// given up): a release waits for it.
	gone chan struct{}
}

// signalOf returns the GET_LOCK name of the signal of e, listed under key.
func (e *leaseSignal) signalOf(key string) string {
	name := key
	if e.kind != driver.Exclusive {
		name = key[:len(key)-len(kindSuffix(e.kind, e.owner))]
	}
	return SignalName(name)
}

// forget removes e, named n, and tells a release waiting for it; ls.mu is
// held.
func (ls *leaseSignals) forget(n string, e *leaseSignal) {
	if ls.names[n] == e {
		delete(ls.names, n)
	}
	if e.gone != nil {
		close(e.gone)
		e.gone = nil
	}
}

func newLeaseSignals(st *store) *leaseSignals {
	return &leaseSignals{st: st, names: map[string]*leaseSignal{}, refusals: newRefusals(), kick: make(chan struct{}, 1), done: make(chan struct{})}
}

func (ls *leaseSignals) poke() {
	select {
	case ls.kick <- struct{}{}:
	default:
	}
}

// grant records a new grant of name to owner. The signal is taken at once
// when the lock is contended (this driver has waiters for it, or was
// refused it lately), otherwise after signalDelay.
func (ls *leaseSignals) grant(name, owner string, contended bool) {
	ls.grantKey(name, driver.Exclusive, owner, contended)
}

// grantKey is grant for a holder of kind k listed under key: a mutex under
// its name, a reader, writer or permit under kindKey. Holders of one name
// in this driver all take name's signal on the one connection (GET_LOCK
// nests within a session), so it is free once the last lets go.
func (ls *leaseSignals) grantKey(key string, k driver.Kind, owner string, contended bool) {
	if n := ls.st.db.Stats().MaxOpenConnections; n > 0 && n < minSignalPool {
		return // the pool is too small to spare a connection
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return
	}
	e := ls.names[key]
	if e == nil {
		e = &leaseSignal{kind: k}
		ls.names[key] = e
	}
	e.owner = owner
	if e.want {
		return
	}
	if contended {
		e.due = 0
		ls.want(e)
		return
	}
	if e.due != 0 {
		return
	}
	e.due = time.Since(signalEpoch) + signalDelay
	ls.delayed = append(ls.delayed, delayedSignal{key: key, e: e, due: e.due})
	if !ls.timer.Armed() {
		ls.timer.Arm(signalDelay, ls.fire)
	}
}

// fire wants the signals of the delayed grants that are due and still
// held, and arms the timer again for the oldest one left.
func (ls *leaseSignals) fire() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.timer.Fired()
	if ls.closed {
		return
	}
	now := time.Since(signalEpoch)
	i := 0
	for ; i < len(ls.delayed) && ls.delayed[i].due <= now; i++ {
		d := ls.delayed[i]
		if ls.names[d.key] == d.e && d.e.due == d.due {
			d.e.due = 0
			ls.want(d.e)
		}
	}
	clear(ls.delayed[:i])
	ls.delayed = ls.delayed[i:]
	if len(ls.delayed) == 0 {
		ls.delayed = nil
	} else {
		ls.timer.Arm(ls.delayed[0].due-now, ls.fire)
	}
}

// want asks for e's signal to be taken; ls.mu is held.
func (ls *leaseSignals) want(e *leaseSignal) {
	e.want = true
	if !ls.started {
		ls.started = true
		ctx, cancel := context.WithCancel(context.Background())
		ls.cancel = cancel
		go ls.run(ctx)
	}
	ls.poke()
}

// refused records that this driver was refused name now.
func (ls *leaseSignals) refused(name string) { ls.refusals.add(name) }

// contended reports whether this driver was refused name within the last
// second, or watches has waiters for it.
func (ls *leaseSignals) contended(name string, watches *sqlcommon.Watches) bool {
	return ls.refusals.recent(name) || watches.Watching(name)
}

// released records that owner no longer holds name (released, or found
// expired). It returns a channel that closes once the signal is given up
// when the server has it (nil when not): a release waits for it (bounded
// by signalReleaseWait), so that waiters are woken before the releaser can
// take the lock again.
func (ls *leaseSignals) released(name, owner string) <-chan struct{} {
	return ls.releasedKey(name, owner)
}

// releasedKey is released for a holder listed under key (see grantKey).
func (ls *leaseSignals) releasedKey(key, owner string) <-chan struct{} {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	e := ls.names[key]
	if ls.closed || e == nil || e.owner != owner {
		return nil
	}
	e.due = 0 // its entry in delayed, if any, is stale now
	e.want = false
	if !e.have && !e.sending {
		ls.forget(key, e)
		return nil
	}
	if e.gone == nil {
		e.gone = make(chan struct{})
	}
	ls.poke()
	return e.gone
}

// signalReleaseWait bounds a release's wait for its signal to be given up.
const signalReleaseWait = time.Second

// awaitSignal waits for gone (from released), at most signalReleaseWait
// and never past ctx.
func awaitSignal(ctx context.Context, gone <-chan struct{}) {
	if gone == nil {
		return
	}
	t := time.NewTimer(signalReleaseWait)
	defer t.Stop()
	select {
	case <-gone:
	case <-t.C:
	case <-ctx.Done():
	}
}

// minSignalPool is the smallest pool limit for which a lease-mode driver
// keeps one of the connections for its wake-up signals.
const minSignalPool = 4

// signalBatch bounds the signals taken or given up in one statement.
const signalBatch = 200

// run sends the changes: GET_LOCK(signal, 0) for wanted signals not yet
// sent, RELEASE_LOCK for sent ones no longer wanted. Its connection is
// returned to the pool when it keeps no signal; if it fails, it is closed
// (which gives up every signal on it) and the wanted ones are sent again
// after a pause.
func (ls *leaseSignals) run(ctx context.Context) {
	defer close(ls.done)
	var conn *sql.Conn
	defer func() {
		if conn != nil {
			discard(conn)
		}
	}()
	pause := 50 * time.Millisecond
	retry := time.Millisecond
	for {
		ls.mu.Lock()
		var (
			names []string
			sent  []bool
			exprs []string
		)
		keep := false
		for n, e := range ls.names {
			if e.want != e.have && len(names) < signalBatch {
				e.sending = true
				names, sent = append(names, n), append(sent, e.want)
				if e.want {
					exprs = append(exprs, "GET_LOCK("+hexLit(e.signalOf(n))+", 0)")
				} else {
					exprs = append(exprs, "RELEASE_LOCK("+hexLit(e.signalOf(n))+")")
				}
			}
			keep = keep || e.have || e.want
		}
		ls.mu.Unlock()
		if len(names) == 0 {
			if !keep && conn != nil {
				// It should keep no signal: make sure, and return it to
				// the pool.
				if _, err := conn.ExecContext(ctx, "DO RELEASE_ALL_LOCKS()"); err != nil {
					discard(conn)
				} else {
					_ = conn.Close()
				}
				conn = nil
			}
			select {
			case <-ctx.Done():
				return
			case <-ls.kick:
			}
			continue
		}
		res, err := ls.send(ctx, &conn, exprs)
		busy := false // a signal another session held for an instant
		ls.mu.Lock()
		for i, n := range names {
			if e := ls.names[n]; e != nil {
				e.sending = false
				if err == nil {
					// A waiter takes and gives back the signal in one
					// statement: a GET_LOCK(…, 0) that meets it gets 0 and
					// must be sent again, or the signal would be thought
					// kept while waiters find it free and poll.
					taken := !sent[i] || (res[i].Valid && res[i].Int64 == 1)
					if taken {
						e.have = sent[i]
					} else {
						busy = true
						ls.busyGets.Add(1)
					}
				}
				if !e.want && !e.have {
					ls.forget(n, e)
				}
			}
		}
		if err != nil {
			// The connection, and every signal on it, is gone.
			for n, e := range ls.names {
				e.have = false
				if !e.want {
					ls.forget(n, e)
				}
			}
		}
		ls.mu.Unlock()
		if err != nil {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			pause = min(pause*2, 5*time.Second)
			continue
		}
		pause = 50 * time.Millisecond
		if busy {
			// Try the busy signals again shortly (another reader's driver
			// may keep one for good: then every retryBusy at most).
			t := time.NewTimer(retry)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-ls.kick:
				t.Stop()
				ls.poke() // the kick is for the next round, not this wait
			case <-t.C:
			}
			retry = min(retry*2, retryBusy)
		} else {
			retry = time.Millisecond
		}
	}
}

// retryBusy bounds the wait before a signal found held by another session
// is asked for again.
const retryBusy = time.Second

// send runs the signal changes exprs on *conn, pinning one first if need
// be, and returns each expression's result (GET_LOCK: 1 when the signal was
// taken, 0 when another session held it at that moment); on failure *conn
// is closed and nil.
func (ls *leaseSignals) send(ctx context.Context, conn **sql.Conn, exprs []string) ([]sql.NullInt64, error) {
	if *conn == nil {
		c, err := poolWait(ctx, ls.st, "mysqllock: a connection for wake-up signals", ls.st.db.Conn)
		if err != nil {
			return nil, err
		}
		*conn = c
	}
	res := make([]sql.NullInt64, len(exprs))
	dest := make([]any, len(exprs))
	for i := range res {
		dest[i] = &res[i]
	}
	err := (*conn).QueryRowContext(ctx, "SELECT "+strings.Join(exprs, ", ")).Scan(dest...)
	if err != nil {
		discard(*conn)
		*conn = nil
		return nil, err
	}
	return res, nil
}

// close stops the goroutine and closes its connection, which gives up
// every signal.
func (ls *leaseSignals) close() {
	ls.mu.Lock()
	ls.closed = true
	for n, e := range ls.names {
		e.due = 0
		ls.forget(n, e)
	}
	ls.delayed = nil
	ls.timer.Stop()
	started := ls.started
	ls.mu.Unlock()
	if started {
		ls.cancel()
		<-ls.done
	}
}
