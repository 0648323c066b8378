package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// turn is one request's node in its queue, from its creation until it is
// granted or given up.
type turn struct {
	d      *Driver
	sess   *session
	conn   *zk.Conn
	parent string // the lock's node
	path   string // the request's node
	own    string // its name under parent
	wait   bool   // wait for the predecessors rather than refuse
	delay  time.Duration

	czxid  int64        // the node's czxid (the token), once known
	known  bool         // czxid is known, and the node is the session's
	statCh chan statRes // delivers the stat read in flight, when the create's reply was not seen
}

type statRes struct {
	st  *zk.Stat // nil when the node does not exist
	err error
}

// wait reads the queue and, when the node at path is not first and wait is
// set, waits for its predecessors (and the lock-delay of a lost holder) to
// go. It returns the grant, confirmed by the last listing of the queue.
// seen is what the create's reply showed, nil when it was not seen (then
// the node's stat is read, alongside the first listing). first, when not
// nil, is a listing of the queue made after the create: it serves as the
// first one.
func (d *Driver) wait(ctx context.Context, sess *session, parent, path string, wait bool, delay time.Duration, seen *created, first *listing) (driver.Grant, error) {
	t := &turn{
		d: d, sess: sess, conn: sess.l.conn,
		parent: parent, path: path, own: path[len(parent)+1:],
		wait: wait, delay: delay,
	}
	if seen != nil {
		if err := t.adopt(ctx, seen.zxid, seen.session); err != nil {
			return driver.Grant{}, err
		}
	} else {
		// The node's stat (its czxid) and the first listing in one round
		// trip.
		t.statCh = make(chan statRes, 1)
		go t.readStat()
	}
	for {
		var (
			sent     time.Time
			children []string
			err      error
		)
		if first != nil {
			sent, children = first.sent, first.children
			first = nil
		} else {
			sent = time.Now()
			children, err = do(ctx, func() ([]string, error) {
				c, _, err := t.conn.Children(parent)
				return c, err
			})
		}
		if err != nil {
			if retry, err := d.waitFailed(ctx, t.sess, "zklock: list queue", err); !retry {
				return driver.Grant{}, err
			}
			continue
		}
		t.sess.Refresh(sent)
		if !t.known {
			if retry, err := t.awaitStat(ctx); err != nil || retry {
				if err != nil {
					return driver.Grant{}, err
				}
				continue
			}
		}
		g, pred, done, err := t.look(ctx, children, sent)
		if done || err != nil {
			return g, err
		}
		if pred == "" {
			continue // look again
		}
		if err := t.awaitGone(ctx, pred); err != nil {
			return driver.Grant{}, err
		}
	}
}

// readStat reads the node's stat and delivers it on statCh.
func (t *turn) readStat() {
	t.d.stats.Add(1)
	ok, st, err := t.conn.Exists(t.path)
	if err == nil && !ok {
		st = nil
	}
	t.statCh <- statRes{st, err}
}

// awaitStat receives the node's stat and checks that the node exists in the
// session. retry means the read failed with a connection loss and was sent
// again: list the queue again, then wait for the new read.
func (t *turn) awaitStat(ctx context.Context) (retry bool, err error) {
	var r statRes
	select {
	case r = <-t.statCh:
	case <-ctx.Done():
		return false, fmt.Errorf("zklock: stat: %w", ctx.Err())
	}
	if r.err != nil {
		switch {
		case t.sess.Lost():
			return false, fmt.Errorf("zklock: while waiting: %w", t.sess.Cause())
		case errors.Is(r.err, zk.ErrSessionExpired):
			return false, fmt.Errorf("zklock: stat %s: %v: %w", t.path, r.err, driver.ErrSessionLost)
		case connLoss(r.err) && t.d.ctx.Err() == nil:
			if err := pause(ctx); err != nil {
				return false, err
			}
			go t.readStat()
			return true, nil
		}
		return false, fmt.Errorf("zklock: stat %s: %w", t.path, r.err)
	}
	if r.st == nil {
		return false, fmt.Errorf("zklock: node %s vanished: %w", t.path, driver.ErrSessionLost)
	}
	return false, t.adopt(ctx, r.st.Czxid, r.st.EphemeralOwner)
}

// adopt records the node's czxid, after checking that its ephemeral owner
// is the turn's session.
func (t *turn) adopt(ctx context.Context, czxid, owner int64) error {
	if owner != t.sess.id {
		// The session changed between our look and the create.
		var err error
		if t.sess, err = t.d.session(ctx, t.sess.l); err != nil {
			return err
		}
		if owner != t.sess.id {
			return fmt.Errorf("zklock: node %s belongs to session %#x, not %#x: %w", t.path, owner, t.sess.id, driver.ErrSessionLost)
		}
	}
	t.czxid, t.known = czxid, true
	return nil
}

// look decides on one listing of the queue, confirmed by a request sent at
// sent: done with the grant or the error to return, or the predecessor to
// wait for (empty: look again at once).
func (t *turn) look(ctx context.Context, children []string, sent time.Time) (g driver.Grant, pred string, done bool, err error) {
	q := queue(children)
	i := slices.Index(q, t.own)
	switch {
	case i < 0:
		if t.sess.Lost() {
			return g, "", true, fmt.Errorf("zklock: while waiting: %w", t.sess.Cause())
		}
		return g, "", true, fmt.Errorf("zklock: node %s was deleted while waiting: %w", t.path, driver.ErrSessionLost)
	case i == 0 && slices.Contains(children, guardName):
		// An earlier holder asked for a lock-delay: is it still running?
		g, done, err := t.awaitDelay(ctx, sent)
		return g, "", done, err
	case i == 0:
		h := &handle{path: t.path, czxid: t.czxid, sess: t.sess}
		if t.delay > 0 {
			if err := t.d.setGuard(ctx, h, t.delay); err != nil {
				return g, "", true, err
			}
		}
		return t.d.grant(h, 1, sent), "", true, nil
	case !t.wait:
		return g, "", true, &driver.LockedError{}
	}
	return g, t.parent + "/" + q[i-1], false, nil
}

// awaitDelay handles the lock-delay guard of an earlier holder found when the
// node is first: it grants when the delay is over (the grant confirmed at
// sent), refuses or waits it out while it runs, and reports not done when
// the queue should be looked at again.
func (t *turn) awaitDelay(ctx context.Context, sent time.Time) (driver.Grant, bool, error) {
	left, err := t.d.checkGuard(ctx, t.conn, t.parent, t.own)
	if err != nil {
		if connLoss(err) && !t.sess.Lost() && t.d.ctx.Err() == nil {
			if err := pause(ctx); err != nil {
				return driver.Grant{}, true, err
			}
			return driver.Grant{}, false, nil
		}
		return driver.Grant{}, true, ctxerr.Wrap(ctx, "zklock: lock-delay guard", err)
	}
	switch {
	case left == 0:
		return driver.Grant{}, false, nil // guard gone: look again
	case left < 0:
		return t.d.grant(&handle{path: t.path, czxid: t.czxid, sess: t.sess}, 1, sent), true, nil
	case !t.wait:
		return driver.Grant{}, true, &driver.LockedError{RetryAfter: left}
	}
	timer := time.NewTimer(left)
	defer timer.Stop()
	if err := block(ctx, t.d, t.sess, timer.C); err != nil {
		return driver.Grant{}, true, err
	}
	return driver.Grant{}, false, nil
}

// awaitGone watches pred and waits until it is deleted (or already gone).
func (t *turn) awaitGone(ctx context.Context, pred string) error {
	type watchRes struct {
		ok bool
		ch <-chan zk.Event
	}
	w, err := do(ctx, func() (watchRes, error) {
		ok, _, ch, err := t.conn.ExistsW(pred)
		return watchRes{ok, ch}, err
	})
	if err != nil {
		_, err := t.d.waitFailed(ctx, t.sess, "zklock: watch predecessor", err)
		return err // nil: retry
	}
	if !w.ok {
		return nil
	}
	return block(ctx, t.d, t.sess, w.ch)
}

// block waits for ch, and returns an error when the session ends, ctx is
// done or the driver closes first.
func block[T any](ctx context.Context, d *Driver, sess *session, ch <-chan T) error {
	select {
	case <-ch:
		return nil
	case <-sess.Done():
		return fmt.Errorf("zklock: while waiting: %w", sess.Cause())
	case <-ctx.Done():
		return fmt.Errorf("zklock: wait: %w", ctx.Err())
	case <-d.ctx.Done():
		return errors.New("zklock: driver is closed")
	}
}

// waitFailed handles the error of a request made while waiting. After a
// connection loss that the session outlives it pauses and reports retry:
// the loss only suspends, so the caller asks again once reconnected.
// Otherwise it returns the error to give up with.
func (d *Driver) waitFailed(ctx context.Context, sess *session, what string, err error) (retry bool, _ error) {
	if connLoss(err) && !sess.Lost() && d.ctx.Err() == nil {
		if err := pause(ctx); err != nil {
			return false, err
		}
		return true, nil
	}
	if sess.Lost() {
		return false, fmt.Errorf("zklock: while waiting: %w", sess.Cause())
	}
	return false, ctxerr.Wrap(ctx, what, err)
}
