package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/sessionlock"
)

// TryAcquire implements driver.Driver: it creates the request's node and,
// when it is not first in the queue, deletes it again and returns a
// *driver.LockedError.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.acquire(ctx, req, false)
}

// Acquire implements driver.Queuer: it creates the request's node and waits,
// watching only the node just before its own, until it is first. On any
// error, including ctx being done or the session expiring while waiting, it
// deletes its node before returning.
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.acquire(ctx, req, true)
}

func (d *Driver) acquire(ctx context.Context, req driver.AcquireRequest, wait bool) (driver.Grant, error) {
	// Every request refreshes the session on the server, so a grant lasts at
	// least the session timeout from the last request that confirmed it:
	// Grant.Sent is that request's send time, from which Grant.TTL counts.
	ops := sessionlock.Ops[*handle]{
		Enqueue: func() (driver.Grant, error) { return d.enqueue(ctx, req, wait) },
		Check:   d.checker(ctx),
		Grant:   d.grant,
	}
	ops.Reenter = func(hd *handle) error {
		// The hold's node is bound to its session, whose timeout is its
		// TTL: it cannot take another.
		if ttl := msTimeout(req.TTL); ttl != hd.sess.ttl {
			return &dlock.InvalidArgumentError{Arg: "TTL", Reason: fmt.Sprintf(
				"zklock: owner %q holds %q already with TTL %v (its session's timeout); re-entering it with TTL %v is not supported", req.Owner, req.Name, hd.sess.ttl, ttl)}
		}
		if req.LockDelay <= 0 || hd.guarded.Load() {
			return nil
		}
		return d.setGuard(ctx, hd, req.LockDelay)
	}
	switch req.Kind {
	case driver.Read, driver.Write:
		ops.Enqueue = func() (driver.Grant, error) { return d.enqueueRW(ctx, req, wait) }
	case driver.Permit:
		ops.Enqueue = func() (driver.Grant, error) { return d.enqueuePermit(ctx, req, wait) }
	}
	return d.holds.Acquire(ctx, sessionlock.HoldName(req.Kind, req.Name), req.Owner, wait, "zklock: acquire", ops)
}

// checker is stillHeld on ctx, with the send time of its request.
func (d *Driver) checker(ctx context.Context) sessionlock.Check[*handle] {
	return func(hd *handle) (bool, time.Time, error) {
		sent := time.Now()
		ok, err := d.stillHeld(ctx, hd)
		return ok, sent, err
	}
}

// grant describes h, confirmed by a request sent at sent.
func (d *Driver) grant(h *handle, count int, sent time.Time) driver.Grant {
	return driver.Grant{
		Token:  uint64(h.token()),
		Count:  count,
		TTL:    h.sess.ttl,
		Sent:   sent,
		Key:    h.path,
		Handle: h,
		Lost:   h.sess.Done(),
		Cause:  h.sess.CauseFunc(),
	}
}

func (d *Driver) stillHeld(ctx context.Context, h *handle) (bool, error) {
	if h.sess.Lost() {
		return false, nil
	}
	st, err := do(ctx, func() (*zk.Stat, error) {
		ok, st, err := h.sess.l.conn.Exists(h.path)
		if err == nil && !ok {
			st = nil
		}
		return st, err
	})
	if err != nil {
		return false, fmt.Errorf("zklock: check node: %w", err)
	}
	return st != nil && st.Czxid == h.czxid, nil
}

// enqueue creates the request's node and, through wait, takes its turn.
func (d *Driver) enqueue(ctx context.Context, req driver.AcquireRequest, wait bool) (driver.Grant, error) {
	l, err := d.linkFor(ctx, req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	sess, err := d.session(ctx, l)
	if err != nil {
		return driver.Grant{}, err
	}
	parent := d.parent(req.Name)
	prefix := d.newPrefix()
	var (
		track   *creates
		written <-chan struct{}
	)
	if l.track != nil {
		track = &l.track.creates
		written = track.expect(parent + "/" + prefix)
	}
	r, pending := d.startCreate(ctx, l.conn, parent, prefix, []byte(req.Owner), written)
	var seen *created
	if track != nil {
		if c, ok := track.done(parent+"/"+prefix, r.path); ok && r.err == nil {
			seen = &c
		}
	}
	switch {
	case pending != nil:
		// The create may still succeed: delete whatever it makes.
		d.discard(sess, parent, prefix, "", pending)
		return driver.Grant{}, fmt.Errorf("zklock: create: %w", ctx.Err())
	case r.err != nil:
		if r.unknown {
			d.discard(sess, parent, prefix, "", nil)
		}
		return driver.Grant{}, ctxerr.Wrap(ctx, "zklock: create", r.err)
	}
	g, err := d.wait(ctx, sess, parent, r.path, wait, req.LockDelay, seen, r.list)
	if err != nil {
		d.discard(sess, parent, prefix, r.path, nil)
		return driver.Grant{}, err
	}
	return g, nil
}

// startCreate runs create, on the calling goroutine when ctx cannot end and
// written is nil. When ctx ends first it returns a channel that delivers
// the create's outcome later.
//
// written, when not nil, is closed by the connection's sniffer as the
// create's request goes on the wire (see creates.expect). The queue is then
// listed at once rather than after the create's reply: ZooKeeper serves a
// session's requests in the order they were sent, so that listing is served
// after the create, and the free-lock path costs one round trip for the
// create and the listing instead of two. A listing that does not show the
// created node (the create failed and was retried, or was never sent) is
// dropped, and wait lists the queue again: it is never trusted without the
// node. The result's list is the listing kept, or nil.
func (d *Driver) startCreate(ctx context.Context, conn *zk.Conn, parent, prefix string, data []byte, written <-chan struct{}) (createResult, <-chan createResult) {
	if ctx.Done() == nil && written == nil {
		return d.create(conn, parent, prefix, data), nil
	}
	ch := make(chan createResult, 1)
	go func() { ch <- d.create(conn, parent, prefix, data) }()
	var list *listing
	select {
	case <-written:
		sent := time.Now()
		children, err := do(ctx, func() ([]string, error) {
			c, _, err := conn.Children(parent)
			return c, err
		})
		if err == nil {
			list = &listing{children: children, sent: sent}
		}
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		return createResult{}, ch
	}
	select {
	case r := <-ch:
		if r.err == nil && list != nil && slices.Contains(list.children, r.path[len(parent)+1:]) {
			r.list = list
		}
		return r, nil
	case <-ctx.Done():
		return createResult{}, ch
	}
}

type createResult struct {
	path    string
	err     error
	unknown bool     // the node may exist
	list    *listing // a listing of the queue served after the create, or nil
}

// listing is one listing of a queue, sent at sent.
type listing struct {
	children []string
	sent     time.Time
}

// create makes the ephemeral sequential node parent/prefix<seq>, creating
// missing parents, and finds it again by its prefix when the reply was lost.
func (d *Driver) create(conn *zk.Conn, parent, prefix string, data []byte) createResult {
	var err error
	for range 5 {
		var p string
		p, err = conn.Create(parent+"/"+prefix, data, zk.FlagEphemeralSequential, d.acl)
		switch {
		case err == nil:
			return createResult{path: p}
		case errors.Is(err, zk.ErrNoNode):
			if perr := d.ensureParents(conn, parent); perr != nil {
				return createResult{err: perr}
			}
		case errors.Is(err, zk.ErrSessionExpired):
			// The node cannot exist; try again in the new session.
		case connLoss(err):
			p, ferr := d.find(conn, parent, prefix)
			if ferr != nil {
				return createResult{err: err, unknown: true}
			}
			if p != "" {
				return createResult{path: p}
			}
		default:
			return createResult{err: err}
		}
	}
	return createResult{err: err, unknown: true}
}

// ensureParents creates parent and its missing ancestors as container nodes
// (the root and every level of a name with '/'), trying the deepest first:
// usually only the lock's own node is missing.
func (d *Driver) ensureParents(conn *zk.Conn, parent string) error {
	_, err := conn.CreateContainer(parent, nil, zk.FlagContainer, d.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if i := strings.LastIndexByte(parent, '/'); i > 0 {
			if err := d.ensureParents(conn, parent[:i]); err != nil {
				return err
			}
			_, err = conn.CreateContainer(parent, nil, zk.FlagContainer, d.acl)
		}
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("zklock: create %s: %w", parent, err)
	}
	return nil
}

// find returns the path of parent's child whose name starts with prefix, or
// "" when there is none.
func (d *Driver) find(conn *zk.Conn, parent, prefix string) (string, error) {
	children, _, err := conn.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, c := range children {
		if strings.HasPrefix(c, prefix) {
			return parent + "/" + c, nil
		}
	}
	return "", nil
}

// discard deletes the node parent/prefix<seq>, made on sess's connection,
// in the background: path when known, else whatever child has the prefix
// (after pending, when not nil, delivers the outcome of a create still in
// flight). It keeps trying until the node is gone, the session that made it
// has ended, or the driver closes, so no error path leaves a node blocking
// the queue.
func (d *Driver) discard(sess *session, parent, prefix, path string, pending <-chan createResult) {
	conn := sess.l.conn
	if cur := d.currentSession(sess.l); cur != nil {
		sess = cur // a create retried after an expiry is in the newest session
	}
	if pending == nil {
		// Try at once, so that a failed TryAcquire leaves nothing behind
		// when it returns.
		ctx, cancel := context.WithTimeout(d.ctx, cleanupTimeout)
		_, err := do(ctx, func() (struct{}, error) { return struct{}{}, d.tryDiscard(conn, parent, prefix, path) })
		cancel()
		if err == nil {
			return
		}
	}
	d.discards.Add(1)
	ok := d.bg.Go(func() {
		defer d.discards.Add(-1)
		if pending != nil {
			select {
			case r := <-pending:
				if r.err != nil && !r.unknown {
					return
				}
				path = r.path
			case <-d.ctx.Done():
				return
			}
		}
		delay := 20 * time.Millisecond
		for {
			if d.tryDiscard(conn, parent, prefix, path) == nil {
				return
			}
			if sess != nil && sess.Lost() {
				return // ephemeral nodes went with the session
			}
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Second)
		}
	})
	if !ok {
		d.discards.Add(-1)
	}
}

func (d *Driver) tryDiscard(conn *zk.Conn, parent, prefix, path string) error {
	if path == "" {
		var err error
		if path, err = d.find(conn, parent, prefix); err != nil || path == "" {
			return err
		}
	}
	err := conn.Delete(path, -1)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}
