package zklock

// Lock-delay (Chubby): when a holder's grant ends without a release, the lock
// stays unavailable for the holder's LockDelay beyond that.
//
// A holder that asked for a lock-delay creates a persistent guard node
// <root>/<name>/dlock-delay beside its queue node, holding its node's name and
// the delay. A release deletes both in one multi request, so the lock is free
// at once. When the holder's node goes without a release (its session
// expired, or someone deleted it), the guard stays. The next request to reach
// the head of the queue "arms" it: in one multi request it replaces the guard
// by a new one holding only the delay, whose ctime is the leader's clock at
// that moment. The lock stays unavailable until the leader's clock, read as
// the mtime of a write to the guard, is the delay past that ctime; then the
// guard is deleted. The delay thus runs from when the loss was first seen,
// which is no earlier than the loss: the lock is unavailable for at least the
// delay. A lock nobody asks for again keeps its guard until someone does.
//
// Times compared are both the leader's wall clock (ZooKeeper exposes no
// other); a leader change between arming and the check compares two servers'
// clocks. Kazoo's Lock knows nothing of guards and ignores lock-delays.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/go-zookeeper/zk"
)

// guardName is the lock-delay guard node in a lock's node. Names with a
// segment of this name are escaped (see escapeName), so no lock lives there.
const guardName = "dlock-delay"

const armed = "armed"

// setGuard creates h's lock-delay guard, h.guard().
func (d *Driver) setGuard(ctx context.Context, h *handle, delay time.Duration) error {
	conn := h.sess.l.conn
	_, own := splitPath(h.path)
	data := own + "\n" + strconv.FormatInt(delay.Milliseconds(), 10)
	_, err := do(ctx, func() (string, error) {
		return conn.Create(h.guard(), []byte(data), zk.FlagPersistent, d.acl)
	})
	if errors.Is(err, zk.ErrNodeExists) {
		// Ours from an earlier hold (another delay): rewrite it.
		_, err = do(ctx, func() (*zk.Stat, error) { return conn.Set(h.guard(), []byte(data), -1) })
	}
	if err != nil {
		return ctxerr.Wrap(ctx, "zklock: create lock-delay guard", err)
	}
	h.guarded.Store(true)
	return nil
}

// deleteHeld deletes h's node and, if it has one, its guard.
func (d *Driver) deleteHeld(h *handle) error {
	conn := h.sess.l.conn
	if h.guarded.Load() {
		_, err := conn.Multi(&zk.DeleteRequest{Path: h.path, Version: h.version()}, &zk.DeleteRequest{Path: h.guard(), Version: -1})
		if err == nil || connLoss(err) {
			return err
		}
		// The guard or the node is gone: delete the node alone.
	}
	return conn.Delete(h.path, h.version())
}

// checkGuard looks, through conn, at the guard in parent for the request whose node own is
// first in the queue. It returns how long the lock must stay unavailable, 0
// when the guard is gone and the queue should be read again, or -1 when the
// guard is own's and does not stand in the way.
func (d *Driver) checkGuard(ctx context.Context, conn *zk.Conn, parent, own string) (time.Duration, error) {
	return d.checkGuardAt(ctx, conn, parent+"/"+guardName, func(holder string) bool { return holder == own })
}

// checkGuardAt looks, through conn, at the guard gp. It returns how long
// the lock must stay unavailable, 0 when the guard is gone (or was just
// deleted as expired) and the caller should look again, or -1 when its
// holder is live (live(holder)) and the guard does not stand in the way.
func (d *Driver) checkGuardAt(ctx context.Context, conn *zk.Conn, gp string, live func(holder string) bool) (time.Duration, error) {
	type got struct {
		data []byte
		st   *zk.Stat
	}
	g, err := do(ctx, func() (got, error) {
		data, st, err := conn.Get(gp)
		return got{data, st}, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	holder, delayMs, ok := strings.Cut(string(g.data), "\n")
	ms, perr := strconv.ParseInt(delayMs, 10, 64)
	if !ok || perr != nil || ms < 0 {
		return 0, fmt.Errorf("zklock: lock-delay guard %s holds %q", gp, g.data)
	}
	delay := time.Duration(ms) * time.Millisecond
	if holder != armed && live(holder) {
		return -1, nil
	}
	if holder != armed {
		// The holder is gone without a release: start the delay now, on
		// the leader's clock.
		_, err := do(ctx, func() ([]zk.MultiResponse, error) {
			return conn.Multi(&zk.DeleteRequest{Path: gp, Version: g.st.Version},
				&zk.CreateRequest{Path: gp, Data: []byte(armed + "\n" + delayMs), Acl: d.acl, Flags: zk.FlagPersistent})
		})
		if errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNodeExists) {
			return time.Millisecond, nil // someone else armed it: look again
		}
		if err != nil {
			return 0, err
		}
		return max(delay, time.Millisecond), nil
	}
	// Armed: read the leader's clock with a write and compare it with the
	// guard's ctime.
	st, err := do(ctx, func() (*zk.Stat, error) { return conn.Set(gp, g.data, -1) })
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	left := delay - time.Duration(st.Mtime-st.Ctime)*time.Millisecond
	if left > 0 {
		return left, nil
	}
	_, err = do(ctx, func() (struct{}, error) { return struct{}{}, conn.Delete(gp, st.Version) })
	if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
		return 0, err
	}
	return 0, nil
}

func splitPath(p string) (parent, name string) {
	i := strings.LastIndexByte(p, '/')
	return p[:i], p[i+1:]
}
