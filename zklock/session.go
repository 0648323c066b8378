package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock"
)

// session is one ZooKeeper session as this driver saw it. Its Session
// records the send time of the last request the server answered (the server
// heard from the session then, so it lives at least a session timeout
// longer) and ends when the driver learns that it expired (or the connection
// was closed).
type session struct {
	*sessionlock.Session
	id  int64
	ttl time.Duration // the timeout the server negotiated
	l   *link
}

// session returns the session of l the driver is watching, starting to
// watch the connection's current one if there is none or the old one is
// gone.
func (d *Driver) session(ctx context.Context, l *link) (*session, error) {
	l.smu.Lock()
	defer l.smu.Unlock()
	if s := l.sess; s != nil && !s.Lost() && s.id == l.conn.SessionID() {
		return s, nil
	}
	if d.ctx.Err() != nil {
		return nil, errors.New("zklock: driver is closed")
	}
	// A data watch on "/" never fires for a change; it fires only when
	// go-zookeeper drops all watches: the session expired or the
	// connection was closed.
	type res struct {
		ch <-chan zk.Event
		id int64
	}
	sent := time.Now()
	r, err := do(ctx, func() (res, error) {
		_, _, ch, err := l.conn.ExistsW("/")
		return res{ch, l.conn.SessionID()}, err
	})
	if err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	ttl, err := l.sessionTimeout(r.id)
	if err != nil {
		return nil, err
	}
	s := &session{Session: sessionlock.NewSession(sent), id: r.id, ttl: ttl, l: l}
	l.sess = s
	ok := d.bg.Go(func() { d.watch(s, r.ch) })
	if !ok {
		return nil, errors.New("zklock: driver is closed")
	}
	return s, nil
}

func (d *Driver) currentSession(l *link) *session {
	l.smu.Lock()
	defer l.smu.Unlock()
	return l.sess
}

// do runs a blocking go-zookeeper call, returning early with an error
// wrapping ctx.Err() when ctx is done first. The call itself runs on.
func do[T any](ctx context.Context, f func() (T, error)) (T, error) {
	if ctx.Done() == nil {
		return f() // ctx cannot end: no goroutine needed
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// connLoss reports whether err is a lost or missing connection, after which
// a request may be repeated.
func connLoss(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer)
}

// pause waits a moment before a request is repeated after a connection loss.
func pause(ctx context.Context) error {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("zklock: wait: %w", ctx.Err())
	}
}

// watch is s's one loop. It ends s when ch, a watch on "/" of s's
// connection, reports that go-zookeeper dropped its watches (the session
// expired or the connection closed), when the driver closes, or when no
// request has been answered for a whole session timeout, counted from its
// send time: by then the server has expired the session, even if
// go-zookeeper cannot reach a server to learn so. Every answered request
// refreshes the session on the server, Renew's node checks included; only
// a session that no request touched for a third of its timeout is probed
// (go-zookeeper's own pings keep the connection up, but the driver cannot
// see their replies).
func (d *Driver) watch(s *session, ch <-chan zk.Event) {
	l := s.l
	step := max(s.ttl/6, 10*time.Millisecond)
	timer := time.NewTimer(step)
	defer timer.Stop()
	var probing atomic.Bool
	for {
		select {
		case <-timer.C:
			since := time.Since(s.RefreshedAt())
			// Wake at the deadline itself, or in a step.
			timer.Reset(max(min(step, s.ttl-since), time.Millisecond))
			if since >= s.ttl {
				s.End(fmt.Errorf("zklock: session %#x: no reply from ZooKeeper within the session timeout %v: %w", s.id, s.ttl, driver.ErrSessionLost))
				return
			}
			if since >= s.ttl/3 && probing.CompareAndSwap(false, true) {
				go func() {
					defer probing.Store(false)
					sent := time.Now()
					if _, err := do(d.ctx, func() (bool, error) { ok, _, err := l.conn.Exists("/"); return ok, err }); err == nil && l.conn.SessionID() == s.id {
						s.Refresh(sent)
					}
				}()
			}
		case ev := <-ch:
			if ev.Type != zk.EventNotWatching {
				// Not expected for "/", but keep watching.
				_, _, again, err := l.conn.ExistsW("/")
				if err == nil {
					ch = again
					continue
				}
				ev.Err = err
			}
			s.End(fmt.Errorf("zklock: session %#x: %v: %w", s.id, ev.Err, driver.ErrSessionLost))
			return
		case <-d.ctx.Done():
			s.End(fmt.Errorf("zklock: session %#x: driver closed: %w", s.id, driver.ErrSessionLost))
			return
		}
	}
}
