package zklock

// Read/write locks and semaphores, in Apache Curator's layouts.
//
// A name's read/write lock lives in the node dlock-rw inside the name's
// mutex node, and its semaphore in dlock-sem (a name segment spelled like
// either is escaped, see escapeName, so no mutex lives there):
//
//	<root>/<name>/dlock-rw/_c_<uuid>-__READ__<seq>    a reader (data: owner)
//	<root>/<name>/dlock-rw/_c_<uuid>-__WRIT__<seq>    a writer
//	<root>/<name>/dlock-rw/dlock-delay-r-<uuid>       a reader's lock-delay guard
//	<root>/<name>/dlock-rw/dlock-delay-w-<uuid>       a writer's lock-delay guard
//	<root>/<name>/dlock-sem                           data: the permit count (4 bytes, big-endian, as Curator's SharedCount)
//	<root>/<name>/dlock-sem/locks/_c_<uuid>-lock-<seq>    the semaphore's mutex
//	<root>/<name>/dlock-sem/leases/_c_<uuid>-lease-<seq>  a permit (data: owner)
//	<root>/<name>/dlock-sem/dlock-delay-<uuid>        a permit holder's lock-delay guard
//
// dlock-rw is the node of Curator's InterProcessReadWriteLock and dlock-sem
// that of its InterProcessSemaphoreV2: node names (protected, "_c_" and a
// UUID), sort rules and grant rules are Curator 5.4's, so that Curator
// clients on the same paths share these locks.
//
// Read/write lock. The children are sorted by what follows the last
// "__READ__" or "__WRIT__" in their names (the sequence number; any other
// name sorts by itself, after the digits). A writer is granted when it is
// first and watches the child just before it; a reader is granted when no
// writer sorts before it and watches the first writer before it (Curator's
// rules, so a waiting writer holds back every later reader: writer
// preference). dlock also waits for lost holders' lock-delay guards: a
// writer for any, a reader for writers'. Curator ignores them.
//
// Semaphore (InterProcessSemaphoreV2). A request takes the semaphore's
// mutex (the queue in locks, Curator's InterProcessMutex: sorted by what
// follows the last "lock-", the first holds it, each waits for the one
// before it), then creates its lease and lists the leases, watching them:
// it is granted once there are no more leases than permits (plus, for
// dlock, lost holders' guards), and then gives the mutex up. Waiters thus
// queue in order in the mutex; only its holder watches the leases. Under
// the mutex, dlock checks the permit count stored in dlock-sem: a request
// with another count is refused (driver.ErrInvalid), unless the semaphore
// is idle (no lease), when the count is rewritten. A request that has to
// wait for the mutex checks the count before it waits, so it is refused at
// once while the semaphore is in use. Curator's clients do not read the
// count.
//
// Tokens. A grant writes its node's data again (its owner) and its token is
// the zxid of that write (mzxid): the write follows the decision, so tokens
// follow grant order even when several readers are granted at once and
// come back in another order than their nodes' (czxids would not). A
// semaphore grant writes its lease and deletes its mutex node in one multi
// request, which also proves that it held the mutex throughout: no other
// lease was created between its own and its grant.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

var _ driver.Kinder = (*Driver)(nil)

// SupportsKind implements driver.Kinder: mutexes, both sides of read/write
// locks, and semaphore permits.
func (d *Driver) SupportsKind(k driver.Kind) bool {
	switch k {
	case driver.Exclusive, driver.Read, driver.Write, driver.Permit:
		return true
	}
	return false
}

const (
	rwNode    = "dlock-rw"  // a name's read/write lock, in its mutex node
	semNode   = "dlock-sem" // a name's semaphore, in its mutex node
	readMark  = "__READ__"  // Curator's InterProcessReadWriteLock.READ_LOCK_NAME
	writeMark = "__WRIT__"  // Curator's WRITE_LOCK_NAME
	lockMark  = "lock-"     // Curator's InterProcessMutex lock name
	leaseMark = "lease-"    // Curator's InterProcessSemaphoreV2.LEASE_BASE_NAME
	kindGuard = guardName + "-"
)

// kindPath is the node of the read/write lock (Read, Write) or semaphore
// (Permit) of name.
func (d *Driver) kindPath(k driver.Kind, name string) string {
	if k == driver.Permit {
		return d.parent(name) + "/" + semNode
	}
	return d.parent(name) + "/" + rwNode
}

// newUUID returns a random (version 4) UUID in canonical form, as Java's
// UUID.randomUUID().toString().
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("zklock: crypto/rand failed: " + err.Error())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// protectedPrefix is Curator's protected name prefix of a node named mark.
func protectedPrefix(id, mark string) string { return "_c_" + id + "-" + mark }

// protectedID returns the UUID of a protected node name.
func protectedID(node string) (string, bool) {
	if len(node) < 3+36+1 || !strings.HasPrefix(node, "_c_") || node[39] != '-' {
		return "", false
	}
	return node[3:39], true
}

// fixForSorting is Curator's StandardLockInternalsDriver.fixForSorting:
// what follows the last mark in s, or s itself.
func fixForSorting(s, mark string) string {
	if i := strings.LastIndex(s, mark); i >= 0 {
		return s[i+len(mark):]
	}
	return s
}

// curatorSort sorts children as Curator's LockInternals.getSortedChildren
// does with a driver whose fixForSorting applies each of marks in turn.
func curatorSort(children []string, marks ...string) []string {
	key := func(s string) string {
		for _, m := range marks {
			s = fixForSorting(s, m)
		}
		return s
	}
	out := slices.Clone(children)
	slices.SortStableFunc(out, func(a, b string) int { return strings.Compare(key(a), key(b)) })
	return out
}

// createOwn creates the ephemeral sequential node parent/prefix<seq> with
// data in sess's connection (and missing parents, as containers) and
// returns its path and czxid. On an error it leaves no node behind.
func (d *Driver) createOwn(ctx context.Context, sess *session, parent, prefix string, data []byte) (string, int64, error) {
	l := sess.l
	var track *creates
	if l.track != nil {
		track = &l.track.creates
		track.expect(parent + "/" + prefix)
	}
	r, pending := d.startCreate(ctx, l.conn, parent, prefix, data, nil)
	var seen *created
	if track != nil {
		if c, ok := track.done(parent+"/"+prefix, r.path); ok && r.err == nil {
			seen = &c
		}
	}
	switch {
	case pending != nil:
		d.discard(sess, parent, prefix, "", pending)
		return "", 0, fmt.Errorf("zklock: create: %w", ctx.Err())
	case r.err != nil:
		if r.unknown {
			d.discard(sess, parent, prefix, "", nil)
		}
		return "", 0, ctxerr.Wrap(ctx, "zklock: create", r.err)
	}
	czxid, owner := int64(0), int64(0)
	if seen != nil {
		czxid, owner = seen.zxid, seen.session
	} else {
		st, err := do(ctx, func() (*zk.Stat, error) {
			ok, st, err := l.conn.Exists(r.path)
			if err == nil && !ok {
				st = nil
			}
			return st, err
		})
		if err != nil {
			d.discard(sess, parent, prefix, r.path, nil)
			return "", 0, ctxerr.Wrap(ctx, "zklock: stat", err)
		}
		if st == nil {
			return "", 0, fmt.Errorf("zklock: node %s vanished: %w", r.path, driver.ErrSessionLost)
		}
		czxid, owner = st.Czxid, st.EphemeralOwner
	}
	if owner != sess.id {
		d.discard(sess, parent, prefix, r.path, nil)
		return "", 0, fmt.Errorf("zklock: node %s belongs to session %#x, not %#x: %w", r.path, owner, sess.id, driver.ErrSessionLost)
	}
	return r.path, czxid, nil
}

// listen lists the children of path (setting a watch on them when watch is
// set) and refreshes sess with the send time.
func (d *Driver) listen(ctx context.Context, sess *session, path string, watch bool) ([]string, <-chan zk.Event, time.Time, error) {
	type res struct {
		c  []string
		ch <-chan zk.Event
	}
	sent := time.Now()
	r, err := do(ctx, func() (res, error) {
		if watch {
			c, _, ch, err := sess.l.conn.ChildrenW(path)
			return res{c, ch}, err
		}
		c, _, err := sess.l.conn.Children(path)
		return res{c, nil}, err
	})
	if err == nil {
		sess.Refresh(sent)
	}
	return r.c, r.ch, sent, err
}

// markGrant writes h's node again (data, any version) and makes the zxid of
// that write h's token.
func (d *Driver) markGrant(ctx context.Context, h *handle, data []byte) error {
	st, err := do(ctx, func() (*zk.Stat, error) { return h.sess.l.conn.Set(h.path, data, -1) })
	if errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("zklock: node %s was deleted as it was granted: %w", h.path, driver.ErrSessionLost)
	}
	if err != nil {
		return ctxerr.Wrap(ctx, "zklock: mark grant", err)
	}
	h.k.token, h.k.version = st.Mzxid, st.Version
	return nil
}

// waitGuards looks at the lock-delay guards among children of parent that
// apply (their names start with guardPrefix, other than own's): it returns
// how long the lock stays unavailable (the longest guard), 0 when none
// stands in the way, or -1 when a guard went meanwhile and the caller should
// look again. live reports whether a guard's holder node still exists
// (then its guard does not stand in the way).
func (d *Driver) waitGuards(ctx context.Context, conn *zk.Conn, parent string, children []string, guardPrefix, own string, live func(holder string) bool) (time.Duration, error) {
	var longest time.Duration
	for _, c := range children {
		if !strings.HasPrefix(c, guardPrefix) || c == own {
			continue
		}
		left, err := d.checkGuardAt(ctx, conn, parent+"/"+c, live)
		if err != nil {
			return 0, err
		}
		switch {
		case left == 0:
			return -1, nil
		case left > longest:
			longest = left
		}
	}
	return longest, nil
}

// sleepOrEvent waits for left, or for ch when not nil.
func sleepOrEvent(ctx context.Context, d *Driver, sess *session, left time.Duration, ch <-chan zk.Event) error {
	timer := time.NewTimer(left)
	defer timer.Stop()
	if ch == nil {
		return block(ctx, d, sess, timer.C)
	}
	select {
	case <-ch:
		return nil
	case <-timer.C:
		return nil
	case <-sess.Done():
		return fmt.Errorf("zklock: while waiting: %w", sess.Cause())
	case <-ctx.Done():
		return fmt.Errorf("zklock: wait: %w", ctx.Err())
	case <-d.ctx.Done():
		return errors.New("zklock: driver is closed")
	}
}

// enqueueRW creates a reader's or writer's node and takes its turn.
func (d *Driver) enqueueRW(ctx context.Context, req driver.AcquireRequest, wait bool) (driver.Grant, error) {
	l, err := d.linkFor(ctx, req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	sess, err := d.session(ctx, l)
	if err != nil {
		return driver.Grant{}, err
	}
	parent := d.kindPath(req.Kind, req.Name)
	id := newUUID()
	mark, gk := readMark, "r-"
	if req.Kind == driver.Write {
		mark, gk = writeMark, "w-"
	}
	prefix := protectedPrefix(id, mark)
	path, czxid, err := d.createOwn(ctx, sess, parent, prefix, []byte(req.Owner))
	if err != nil {
		return driver.Grant{}, err
	}
	h := &handle{path: path, czxid: czxid, sess: sess, k: &kindGrant{kind: req.Kind, guardPath: parent + "/" + kindGuard + gk + id}}
	g, err := d.waitRW(ctx, h, parent, []byte(req.Owner), wait, req.LockDelay)
	if err != nil {
		d.discard(sess, parent, prefix, path, nil)
		return driver.Grant{}, err
	}
	return g, nil
}

// waitRW waits until h's node may hold the read/write lock in parent
// (Curator's rules, then lost holders' guards), and grants it.
func (d *Driver) waitRW(ctx context.Context, h *handle, parent string, data []byte, wait bool, delay time.Duration) (driver.Grant, error) {
	t := &turn{d: d, sess: h.sess, conn: h.sess.l.conn, parent: parent}
	_, own := splitPath(h.path)
	_, ownGuard := splitPath(h.k.guardPath)
	for {
		children, _, sent, err := d.listen(ctx, h.sess, parent, false)
		if err != nil {
			if retry, err := d.waitFailed(ctx, h.sess, "zklock: list queue", err); !retry {
				return driver.Grant{}, err
			}
			continue
		}
		sorted := curatorSort(children, readMark, writeMark)
		i := slices.Index(sorted, own)
		if i < 0 {
			if h.sess.Lost() {
				return driver.Grant{}, fmt.Errorf("zklock: while waiting: %w", h.sess.Cause())
			}
			return driver.Grant{}, fmt.Errorf("zklock: node %s was deleted while waiting: %w", h.path, driver.ErrSessionLost)
		}
		pred, guards := "", kindGuard
		if h.k.kind == driver.Write {
			if i > 0 {
				pred = sorted[i-1]
			}
		} else {
			guards += "w-"
			for _, c := range sorted[:i] {
				if strings.Contains(c, writeMark) {
					pred = c // the first writer before it, as Curator's reader watches
					break
				}
			}
		}
		if pred != "" {
			if !wait {
				return driver.Grant{}, &driver.LockedError{}
			}
			if err := t.awaitGone(ctx, parent+"/"+pred); err != nil {
				return driver.Grant{}, err
			}
			continue
		}
		left, err := d.waitGuards(ctx, t.conn, parent, children, guards, ownGuard, func(holder string) bool { return slices.Contains(children, holder) })
		if err != nil {
			if retry, err := d.waitFailed(ctx, h.sess, "zklock: lock-delay guard", err); !retry {
				return driver.Grant{}, err
			}
			continue
		}
		switch {
		case left < 0:
			continue
		case left > 0 && !wait:
			return driver.Grant{}, &driver.LockedError{RetryAfter: left}
		case left > 0:
			if err := sleepOrEvent(ctx, d, h.sess, left, nil); err != nil {
				return driver.Grant{}, err
			}
			continue
		}
		if err := d.markGrant(ctx, h, data); err != nil {
			return driver.Grant{}, err
		}
		if delay > 0 {
			if err := d.setGuard(ctx, h, delay); err != nil {
				return driver.Grant{}, err
			}
		}
		return d.grant(h, 1, sent), nil
	}
}

// permitBytes is a permit count as Curator's SharedCount stores it.
func permitBytes(n int) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(n))
}

// semState is what the semaphore looks like to a request: its stored count
// (0 when unset), the version of its node, and the permits taken.
type semState struct {
	stored  int
	version int32
	exists  bool
	leases  []string
	guards  []string // lock-delay guards in the semaphore's node
}

// orphans counts the guards whose holder lease is gone.
func (s *semState) orphans() []string {
	var out []string
	for _, g := range s.guards {
		id := strings.TrimPrefix(g, kindGuard)
		if !slices.ContainsFunc(s.leases, func(l string) bool { return strings.HasPrefix(l, protectedPrefix(id, "")) }) {
			out = append(out, g)
		}
	}
	return out
}

// readSem reads the semaphore at sem: its count, leases and guards.
func (d *Driver) readSem(ctx context.Context, sess *session, sem string) (*semState, error) {
	conn := sess.l.conn
	type got struct {
		data []byte
		st   *zk.Stat
	}
	g, err := do(ctx, func() (got, error) {
		data, st, err := conn.Get(sem)
		return got{data, st}, err
	})
	s := &semState{}
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return s, nil
	case err != nil:
		return nil, err
	}
	s.exists, s.version = true, g.st.Version
	switch len(g.data) {
	case 0:
	case 4:
		s.stored = int(int32(binary.BigEndian.Uint32(g.data)))
	default:
		return nil, fmt.Errorf("zklock: semaphore %s holds %q, not a permit count", sem, g.data)
	}
	children, _, _, err := d.listen(ctx, sess, sem, false)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return nil, err
	}
	for _, c := range children {
		if strings.HasPrefix(c, kindGuard) {
			s.guards = append(s.guards, c)
		}
	}
	s.leases, _, _, err = d.listen(ctx, sess, sem+"/leases", false)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return nil, err
	}
	return s, nil
}

func countError(name string, stored, permits int) error {
	return fmt.Errorf("zklock: semaphore %q has %d permits, not %d (its size is set by its first holder while any holds it): %w", name, stored, permits, driver.ErrInvalid)
}

// enqueuePermit takes a permit of the semaphore of req.Name as Curator's
// InterProcessSemaphoreV2 does: its mutex, then a lease.
func (d *Driver) enqueuePermit(ctx context.Context, req driver.AcquireRequest, wait bool) (driver.Grant, error) {
	if req.Permits < 1 {
		return driver.Grant{}, fmt.Errorf("zklock: semaphore %q: permits %d, want at least 1: %w", req.Name, req.Permits, driver.ErrInvalid)
	}
	l, err := d.linkFor(ctx, req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	sess, err := d.session(ctx, l)
	if err != nil {
		return driver.Grant{}, err
	}
	sem := d.kindPath(driver.Permit, req.Name)
	locks, leases := sem+"/locks", sem+"/leases"
	id := newUUID()
	mprefix := protectedPrefix(id, lockMark)
	mpath, _, err := d.createOwn(ctx, sess, locks, mprefix, []byte(req.Owner))
	if err != nil {
		return driver.Grant{}, err
	}
	g, lpath, err := d.takePermit(ctx, sess, req, wait, sem, mpath, id)
	if err != nil {
		if lpath != "" {
			d.discard(sess, leases, protectedPrefix(id, leaseMark), lpath, nil)
		}
		d.discard(sess, locks, mprefix, mpath, nil)
		return driver.Grant{}, err
	}
	return g, nil
}

// takePermit waits for the semaphore's mutex (held through the node mpath),
// checks the permit count, creates the lease and waits for it to be
// granted. It returns the lease's path once created, also with an error.
func (d *Driver) takePermit(ctx context.Context, sess *session, req driver.AcquireRequest, wait bool, sem, mpath, id string) (driver.Grant, string, error) {
	conn := sess.l.conn
	t := &turn{d: d, sess: sess, conn: conn}
	locks, leases := sem+"/locks", sem+"/leases"
	_, own := splitPath(mpath)
	checked := false
	for {
		children, _, _, err := d.listen(ctx, sess, locks, false)
		if err != nil {
			if retry, err := d.waitFailed(ctx, sess, "zklock: list semaphore queue", err); !retry {
				return driver.Grant{}, "", err
			}
			continue
		}
		sorted := curatorSort(children, lockMark)
		i := slices.Index(sorted, own)
		if i < 0 {
			return driver.Grant{}, "", fmt.Errorf("zklock: node %s was deleted while waiting: %w", mpath, driver.ErrSessionLost)
		}
		if i == 0 {
			break
		}
		if !checked || !wait {
			// Before waiting behind others: refuse another count, or (a
			// TryAcquire) a semaphore whose permits are all taken, at once.
			s, err := d.readSem(ctx, sess, sem)
			if err != nil {
				return driver.Grant{}, "", ctxerr.Wrap(ctx, "zklock: read semaphore", err)
			}
			if s.stored != 0 && s.stored != req.Permits && len(s.leases) > 0 {
				return driver.Grant{}, "", countError(req.Name, s.stored, req.Permits)
			}
			if !wait && len(s.leases)+len(s.orphans()) >= req.Permits {
				return driver.Grant{}, "", &driver.LockedError{}
			}
			checked = true
		}
		if err := t.awaitGone(ctx, locks+"/"+sorted[i-1]); err != nil {
			return driver.Grant{}, "", err
		}
	}
	// The mutex is ours: check (or set) the count, then take a lease.
	for {
		s, err := d.readSem(ctx, sess, sem)
		if err != nil {
			return driver.Grant{}, "", ctxerr.Wrap(ctx, "zklock: read semaphore", err)
		}
		if s.stored == req.Permits {
			break
		}
		if s.stored != 0 && len(s.leases) > 0 {
			return driver.Grant{}, "", countError(req.Name, s.stored, req.Permits)
		}
		// Unset, or idle: store ours.
		_, err = do(ctx, func() (*zk.Stat, error) { return conn.Set(sem, permitBytes(req.Permits), s.version) })
		if err != nil && !errors.Is(err, zk.ErrBadVersion) {
			return driver.Grant{}, "", ctxerr.Wrap(ctx, "zklock: store permit count", err)
		}
	}
	lprefix := protectedPrefix(id, leaseMark)
	lpath, czxid, err := d.createOwn(ctx, sess, leases, lprefix, []byte(req.Owner))
	if err != nil {
		return driver.Grant{}, "", err
	}
	h := &handle{path: lpath, czxid: czxid, sess: sess, k: &kindGrant{kind: driver.Permit, guardPath: sem + "/" + kindGuard + id}}
	_, lease := splitPath(lpath)
	for {
		children, ch, sent, err := d.listen(ctx, sess, leases, wait)
		if err != nil {
			if retry, err := d.waitFailed(ctx, sess, "zklock: list leases", err); !retry {
				return driver.Grant{}, lpath, err
			}
			continue
		}
		if !slices.Contains(children, lease) {
			return driver.Grant{}, lpath, fmt.Errorf("zklock: node %s was deleted while waiting: %w", lpath, driver.ErrSessionLost)
		}
		var orphans []string
		if len(children) <= req.Permits {
			s, err := d.readSem(ctx, sess, sem)
			if err != nil {
				return driver.Grant{}, lpath, ctxerr.Wrap(ctx, "zklock: read semaphore", err)
			}
			s.leases = children
			orphans = s.orphans()
		}
		if len(children)+len(orphans) <= req.Permits {
			// Granted: mark the lease and give the mutex up at once; the
			// mutex node's deletion proves it was held throughout.
			resp, err := do(ctx, func() ([]zk.MultiResponse, error) {
				return conn.Multi(&zk.DeleteRequest{Path: mpath, Version: -1}, &zk.SetDataRequest{Path: lpath, Data: []byte(req.Owner), Version: -1})
			})
			switch {
			case errors.Is(err, zk.ErrNoNode):
				return driver.Grant{}, lpath, fmt.Errorf("zklock: semaphore node gone as it was granted: %w", driver.ErrSessionLost)
			case err != nil:
				return driver.Grant{}, lpath, ctxerr.Wrap(ctx, "zklock: grant permit", err)
			}
			if st := resp[1].Stat; st != nil {
				h.k.token, h.k.version = st.Mzxid, st.Version
			}
			if h.k.token == 0 {
				return driver.Grant{}, lpath, errors.New("zklock: grant permit: no stat in the reply")
			}
			if req.LockDelay > 0 {
				if err := d.setGuard(ctx, h, req.LockDelay); err != nil {
					return driver.Grant{}, lpath, err
				}
			}
			return d.grant(h, 1, sent), lpath, nil
		}
		if len(children) > req.Permits {
			if !wait {
				return driver.Grant{}, lpath, &driver.LockedError{}
			}
			if err := block(ctx, d, sess, ch); err != nil {
				return driver.Grant{}, lpath, err
			}
			continue
		}
		// Only lost holders' guards stand in the way.
		left, err := d.waitGuards(ctx, conn, sem, orphans, kindGuard, "", func(string) bool { return false })
		if err != nil {
			if retry, err := d.waitFailed(ctx, sess, "zklock: lock-delay guard", err); !retry {
				return driver.Grant{}, lpath, err
			}
			continue
		}
		switch {
		case left <= 0:
			continue
		case !wait:
			return driver.Grant{}, lpath, &driver.LockedError{RetryAfter: left}
		}
		if err := sleepOrEvent(ctx, d, sess, left, ch); err != nil {
			return driver.Grant{}, lpath, err
		}
	}
}

// rwHolders returns, of the sorted children of a read/write lock, the
// holders: the writer at the head, or the readers before the first writer.
func rwHolders(sorted []string) (holders []string, write bool) {
	for i, c := range sorted {
		switch {
		case strings.Contains(c, writeMark):
			if i == 0 {
				return sorted[:1], true
			}
			return holders, false
		case strings.Contains(c, readMark):
			holders = append(holders, c)
		}
	}
	return holders, false
}

// inspectKind describes the read/write lock (k Write) or semaphore (k
// Permit) whose node is path, for name; ok is false when it has no nodes.
func (d *Driver) inspectKind(ctx context.Context, conn *zk.Conn, name, path string, k driver.Kind) (driver.LockInfo, bool, error) {
	list := func(p string) ([]string, error) {
		c, err := do(ctx, func() ([]string, error) {
			c, _, err := conn.Children(p)
			return c, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil, nil
		}
		return c, err
	}
	info := driver.LockInfo{Name: name, Kind: k, ExpiresIn: -1}
	var holders []string
	var dir string
	lost, lostLeft := 0, time.Duration(0) // a semaphore's lost holders' guards
	if k == driver.Write {
		children, err := list(path)
		if err != nil {
			return info, false, err
		}
		var nodes []string
		for _, c := range children {
			if strings.Contains(c, readMark) || strings.Contains(c, writeMark) {
				nodes = append(nodes, c)
			}
		}
		live := func(holder string) bool { return slices.Contains(nodes, holder) }
		nW, leftW, err := d.lostGuards(ctx, conn, path, children, kindGuard+"w-", live)
		if err != nil {
			return info, false, err
		}
		nR, leftR, err := d.lostGuards(ctx, conn, path, children, kindGuard+"r-", live)
		if err != nil {
			return info, false, err
		}
		sorted := curatorSort(nodes, readMark, writeMark)
		if nW > 0 || nR > 0 && (len(sorted) == 0 || strings.Contains(sorted[0], writeMark)) {
			// Kept by lost holders' guards: a writer waits for all, a
			// reader for writers'.
			info.Owner, info.Waiters, info.ExpiresIn = LockDelayOwner, len(sorted), leftW
			if leftR < 0 || leftW >= 0 && leftR > leftW {
				info.ExpiresIn = leftR
			}
			return info, true, nil
		}
		if len(nodes) == 0 {
			return info, false, nil
		}
		var write bool
		holders, write = rwHolders(sorted)
		dir = path
		info.Waiters = len(sorted) - len(holders)
		if !write {
			info.Readers = len(holders)
		}
	} else {
		data, err := do(ctx, func() ([]byte, error) {
			data, _, err := conn.Get(path)
			return data, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return info, false, nil
		}
		if err != nil {
			return info, false, err
		}
		if len(data) == 4 {
			info.Permits = int(int32(binary.BigEndian.Uint32(data)))
		}
		leases, err := list(path + "/leases")
		if err != nil {
			return info, false, err
		}
		locks, err := list(path + "/locks")
		if err != nil {
			return info, false, err
		}
		semChildren, err := list(path)
		if err != nil {
			return info, false, err
		}
		lost, lostLeft, err = d.lostGuards(ctx, conn, path, semChildren, kindGuard, func(holder string) bool { return slices.Contains(leases, holder) })
		if err != nil {
			return info, false, err
		}
		if len(leases)+len(locks)+lost == 0 {
			return info, false, nil
		}
		holders = curatorSort(leases, leaseMark)
		if info.Permits > 0 && len(holders) > max(info.Permits-lost, 0) {
			holders = holders[:max(info.Permits-lost, 0)]
		}
		dir = path + "/leases"
		info.Holders = len(holders) + lost
		info.Waiters = len(locks)
		if len(leases) > info.Permits && info.Permits > 0 {
			// The mutex holder's lease waits: it is counted in locks.
			info.Waiters = max(len(locks), 1)
		}
	}
	for _, n := range holders {
		type node struct {
			data []byte
			st   *zk.Stat
		}
		got, err := do(ctx, func() (node, error) {
			data, st, err := conn.Get(dir + "/" + n)
			return node{data, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return info, false, err
		}
		info.Count++
		if tok := uint64(got.st.Mzxid); tok > info.Token {
			info.Token = tok
		}
		if !bytes.Equal(got.data, nil) {
			info.Owner = string(got.data)
		}
	}
	if info.Count > 1 || lost > 0 {
		info.Owner = ""
	}
	if info.Count == 0 && lost > 0 {
		info.Owner, info.ExpiresIn = LockDelayOwner, lostLeft
	}
	return info, true, nil
}
