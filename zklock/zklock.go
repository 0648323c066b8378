// Package zklock is the dlock driver for Apache ZooKeeper.
//
// Import it for its side effect to make the zk:// URL scheme available to
// dlock.Open, or call New with a *zk.Conn (github.com/go-zookeeper/zk) you
// connected yourself:
//
//	import _ "github.com/dlock/dlock/zklock"
//	client, err := dlock.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181/locks")
//
// # How a lock works
//
// Each lock name is a node <root>/<name> (created as a container node with
// its missing parents, so the server removes it once it is empty again). A
// request creates an ephemeral sequential child of it named
//
//	<32 hex digits of a random GUID>__lock__<10-digit sequence number>
//
// and the child with the lowest sequence number holds the lock. A '/' in a
// name makes nested nodes; a character ZooKeeper refuses in paths (such as
// one outside the Basic Multilingual Plane) is written as %XX escapes of its
// UTF-8 bytes, and so is '%' itself (see escapeName). A waiter
// watches only the child just before its own (no herd) and looks again when
// it is deleted. The fencing token is the holder's czxid, the transaction ID
// that created its node, which ZooKeeper makes strictly increasing.
//
// The GUID makes names protected, as in Curator and kazoo: when the reply to
// a create is lost with the connection, the driver finds its node again by the
// GUID instead of leaving an orphan that would block the queue. Every error
// path of Acquire, including a cancelled context, deletes the request's node;
// if the server cannot be reached at that moment the driver keeps trying in
// the background until the node is gone or its session has ended.
//
// The naming is Python kazoo's Lock recipe (kazoo.recipe.lock.Lock): a dlock
// lock on name X with root R and kazoo's client.Lock(R + "/" + X) exclude
// each other and share one queue. The node's data is the owner string, as
// kazoo stores its identifier there. Curator's InterProcessMutex names its
// nodes differently (_c_<guid>-lock-<seq>) and is not recognised.
//
// # Sessions, TTL and loss
//
// Every node is bound to the connection's ZooKeeper session, and a grant
// lives as long as that session. Grant.TTL reports Options.SessionTimeout. A
// connection loss only suspends: go-zookeeper reconnects, within the session
// timeout, to any server of the ensemble and the session and its nodes live
// on. When the session expires, the Lost channel of every grant made in it
// closes with a cause wrapping driver.ErrSessionLost; go-zookeeper then
// establishes a new session, which serves later locks. The driver also gives
// a session up on its own once no request has been answered for a whole
// session timeout, counted from the request's send time (it probes an idle
// session every third of the timeout): by then the server has expired it,
// even if no server can be reached to say so. A node deleted by
// someone else is found by the next Renew (driver.ErrNotHeld).
//
// Re-entrance is per driver: the same owner taking the same name again on the
// same driver increments a hold count kept by the driver. The same owner
// string used through another connection queues like any other owner.
//
// Lock-delay is supported through a guard node per lock (see delay.go): a
// holder that ends without a release keeps the lock unavailable for its
// LockDelay after the loss is first seen; a release frees it at once.
//
// # Guarantees
//
// Mutual exclusion holds as far as ZooKeeper's ordering does: the queue is
// decided by sequence numbers assigned by the leader, and a holder's node
// outlives it by at most the session timeout. A holder partitioned from the
// ensemble keeps believing it holds the lock until its session timeout passes
// locally, while the server may already have expired its session; the dlock
// package's validity deadline and the fencing token cover that window.
package zklock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/queuelock"
)

// DefaultRoot is the node under which lock nodes live when Options.Root is
// empty.
const DefaultRoot = "/dlock"

// DefaultSessionTimeout is the session timeout reported as Grant.TTL (and,
// for drivers opened from a URL, asked of the server) when
// Options.SessionTimeout is zero.
const DefaultSessionTimeout = 10 * time.Second

// cleanupTimeout bounds how long Close waits for background cleanup.
const cleanupTimeout = 5 * time.Second

// nodeMarker separates the GUID from the sequence number in a node's name;
// it is kazoo's Lock._NODE_NAME.
const nodeMarker = "__lock__"

// contender matches the lock nodes of a queue (kazoo's contender pattern).
var contender = regexp.MustCompile(`__lock__(-?\d{10})$`)

// Options configure a Driver. The zero value (or nil) gives the defaults.
type Options struct {
	// Root is the node under which every lock's node is created: the lock
	// named X lives at Root + "/" + X. It must be an absolute ZooKeeper path
	// without a trailing '/', or "/" itself. Default DefaultRoot. URL: the
	// path after the hosts.
	Root string
	// SessionTimeout is the session timeout of the connection, reported as
	// Grant.TTL. Pass the timeout you gave zk.Connect. Default
	// DefaultSessionTimeout. URL: session_timeout.
	SessionTimeout time.Duration
	// ACL is set on every node the driver creates. Default
	// zk.WorldACL(zk.PermAll). URL: acl=open (the default), acl=creator
	// (only the authenticated creator may do anything) or acl=creator_read
	// (creator all, everyone read).
	ACL []zk.ACL
}

// Driver is a dlock driver over a ZooKeeper connection. It implements
// driver.Driver and driver.Queuer. It is safe for
// concurrent use. Create it with New.
type Driver struct {
	conn     *zk.Conn
	ownsConn bool
	root     string
	ttl      time.Duration
	acl      []zk.ACL

	bg       *queuelock.Group // session watchers and background deletes
	ctx      context.Context  // bg's: cancelled by Close
	discards atomic.Int64     // background deletes still running

	smu  sync.Mutex
	sess *session

	holds queuelock.Holds[*handle] // re-entrance by (name, owner)
}

var (
	_ driver.Driver = (*Driver)(nil)
	_ driver.Queuer = (*Driver)(nil)
)

// session is one ZooKeeper session as this driver saw it. Its Session
// records the send time of the last request the server answered (the server
// heard from the session then, so it lives at least a session timeout
// longer) and ends when the driver learns that it expired (or the connection
// was closed).
type session struct {
	*queuelock.Session
	id int64
}

// handle is the Grant.Handle of this driver.
type handle struct {
	path    string
	czxid   int64
	sess    *session
	guarded atomic.Bool // a lock-delay guard of this grant exists (see delay.go)
}

// New returns a driver over conn. The driver does not close conn: Close stops
// only the driver's own goroutines. opts may be nil.
func New(conn *zk.Conn, opts *Options) (*Driver, error) {
	if conn == nil {
		return nil, errors.New("zklock: New: connection is nil")
	}
	return newDriver(conn, false, opts)
}

func newDriver(conn *zk.Conn, owns bool, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Root == "" {
		o.Root = DefaultRoot
	}
	if err := checkRoot(o.Root); err != nil {
		return nil, err
	}
	if o.SessionTimeout < 0 {
		return nil, fmt.Errorf("zklock: SessionTimeout %v is negative", o.SessionTimeout)
	}
	if o.SessionTimeout == 0 {
		o.SessionTimeout = DefaultSessionTimeout
	}
	if o.ACL == nil {
		o.ACL = zk.WorldACL(zk.PermAll)
	}
	bg := queuelock.NewGroup()
	return &Driver{
		conn:     conn,
		ownsConn: owns,
		root:     o.Root,
		ttl:      o.SessionTimeout,
		acl:      o.ACL,
		bg:       bg,
		ctx:      bg.Context(),
	}, nil
}

func checkRoot(root string) error {
	if root == "/" {
		return nil
	}
	if !strings.HasPrefix(root, "/") || strings.HasSuffix(root, "/") {
		return fmt.Errorf("zklock: root %q must start with '/' and not end with one", root)
	}
	if err := checkSegments(root[1:]); err != nil {
		return fmt.Errorf("zklock: root %q: %v", root, err)
	}
	return nil
}

func checkSegments(p string) error {
	for _, seg := range strings.Split(p, "/") {
		switch {
		case seg == "":
			return errors.New("zklock: empty path segment (leading, trailing or doubled '/')")
		case seg == "." || seg == "..":
			return fmt.Errorf("zklock: path segment %q is not allowed", seg)
		case contender.MatchString(seg):
			return fmt.Errorf("zklock: path segment %q looks like a lock node", seg)
		}
		for _, r := range seg {
			if !zkRune(r) {
				return fmt.Errorf("zklock: character %U is not allowed in ZooKeeper paths", r)
			}
		}
	}
	return nil
}

// parent is the node under which name's queue lives.
func (d *Driver) parent(name string) string {
	if d.root == "/" {
		return "/" + escapeName(name, true)
	}
	return d.root + "/" + escapeName(name, false)
}

// escapeName maps a lock name onto a relative ZooKeeper path. Names made of
// characters ZooKeeper accepts, with non-empty '/'-separated segments, map
// verbatim. Otherwise '%' and each byte of a character ZooKeeper refuses
// (control characters, characters outside the Basic Multilingual Plane,
// private-use and special characters) are written as %XX, as is a '/' that
// would make an empty segment, the dots of a "." or ".." segment, one '_' of
// a segment that looks like a lock node, and the 'z' of "zookeeper" directly
// under "/". Decoding the %XX escapes gives the name back, so two names never
// share a path.
func escapeName(name string, atRoot bool) string {
	var b strings.Builder
	esc := func(s string) {
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, "%%%02X", s[i])
		}
	}
	segs := strings.Split(name, "/")
	for i, seg := range segs {
		if i > 0 {
			// Keep the '/' only between two non-empty segments.
			if segs[i-1] != "" && seg != "" {
				b.WriteByte('/')
			} else {
				esc("/")
			}
		}
		if seg == "." || seg == ".." {
			esc(seg)
			continue
		}
		if (i == 0 && atRoot && seg == "zookeeper") || seg == guardName {
			esc(seg[:1])
			seg = seg[1:]
		}
		cut := -1
		if m := contender.FindStringIndex(seg); m != nil {
			cut = m[0] // the first '_' of "__lock__"
		}
		for j, r := range seg {
			switch {
			case j == cut || r == '%' || !zkRune(r):
				esc(string(r))
			default:
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}

// zkRune reports whether ZooKeeper accepts r in a path. ZooKeeper checks
// UTF-16 code units, so characters outside the BMP (surrogate pairs) are
// refused too.
func zkRune(r rune) bool {
	return r != utf8.RuneError && r > 0x1f && (r < 0x7f || r > 0x9f) && (r < 0xd800 || r > 0xf8ff) && r < 0xfff0
}

// do runs a blocking go-zookeeper call, returning early with an error
// wrapping ctx.Err() when ctx is done first. The call itself runs on.
func do[T any](ctx context.Context, f func() (T, error)) (T, error) {
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

// session returns the session the driver is watching, starting to watch the
// connection's current one if there is none or the old one is gone.
func (d *Driver) session(ctx context.Context) (*session, error) {
	d.smu.Lock()
	defer d.smu.Unlock()
	if s := d.sess; s != nil && !s.Lost() && s.id == d.conn.SessionID() {
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
		_, _, ch, err := d.conn.ExistsW("/")
		return res{ch, d.conn.SessionID()}, err
	})
	if err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	s := &session{Session: queuelock.NewSession(sent), id: r.id}
	d.sess = s
	ok := d.bg.Go(func() {
		// Besides the watch, the session is given up when no request has
		// been answered for a whole session timeout, counted from its send
		// time: by then the server has expired it, even if go-zookeeper
		// cannot reach a server to learn so. An idle session is probed
		// every third of the timeout.
		step := max(d.ttl/6, 10*time.Millisecond)
		timer := time.NewTimer(step)
		defer timer.Stop()
		var probing atomic.Bool
		for {
			select {
			case <-timer.C:
				since := time.Since(s.RefreshedAt())
				// Wake at the deadline itself, or in a step.
				timer.Reset(max(min(step, d.ttl-since), time.Millisecond))
				if since >= d.ttl {
					s.End(fmt.Errorf("zklock: session %#x: no reply from ZooKeeper within the session timeout %v: %w", s.id, d.ttl, driver.ErrSessionLost))
					return
				}
				if since >= d.ttl/3 && probing.CompareAndSwap(false, true) {
					go func() {
						defer probing.Store(false)
						sent := time.Now()
						if _, err := do(d.ctx, func() (bool, error) { ok, _, err := d.conn.Exists("/"); return ok, err }); err == nil && d.conn.SessionID() == s.id {
							s.Refresh(sent)
						}
					}()
				}
			case ev := <-r.ch:
				if ev.Type != zk.EventNotWatching {
					// Not expected for "/", but keep watching.
					_, _, ch, err := d.conn.ExistsW("/")
					if err == nil {
						r.ch = ch
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
	})
	if !ok {
		return nil, errors.New("zklock: driver is closed")
	}
	return s, nil
}

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
	// least the session timeout from the last request that confirmed it;
	// Grant.TTL counts from start, the moment the dlock package measures
	// from.
	start := time.Now()
	ops := queuelock.Ops[*handle]{
		Enqueue: func() (driver.Grant, error) { return d.enqueue(ctx, req, wait, start) },
		Check:   d.checker(ctx),
		Grant:   d.grant,
	}
	if req.LockDelay > 0 {
		ops.Reenter = func(hd *handle) error {
			if hd.guarded.Load() {
				return nil
			}
			return d.setGuard(ctx, hd, req.LockDelay)
		}
	}
	return d.holds.Acquire(ctx, req.Name, req.Owner, wait, "zklock: acquire", ops)
}

// checker is stillHeld on ctx, with the send time of its request.
func (d *Driver) checker(ctx context.Context) queuelock.Check[*handle] {
	return func(hd *handle) (bool, time.Time, error) {
		sent := time.Now()
		ok, err := d.stillHeld(ctx, hd)
		return ok, sent, err
	}
}

// grant describes h, confirmed by a request sent at sent.
func (d *Driver) grant(h *handle, count int, sent time.Time) driver.Grant {
	return driver.Grant{
		Token:  uint64(h.czxid),
		Count:  count,
		TTL:    d.ttl,
		Sent:   sent,
		Handle: h,
		Lost:   h.sess.Done(),
		Cause:  h.sess.Cause,
	}
}

func (d *Driver) stillHeld(ctx context.Context, h *handle) (bool, error) {
	if h.sess.Lost() {
		return false, nil
	}
	st, err := do(ctx, func() (*zk.Stat, error) {
		ok, st, err := d.conn.Exists(h.path)
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

// newPrefix returns a fresh protected node name prefix.
func newPrefix() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("zklock: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:]) + nodeMarker
}

func (d *Driver) enqueue(ctx context.Context, req driver.AcquireRequest, wait bool, start time.Time) (driver.Grant, error) {
	sess, err := d.session(ctx)
	if err != nil {
		return driver.Grant{}, err
	}
	parent := d.parent(req.Name)
	prefix := newPrefix()
	created := make(chan createResult, 1)
	go func() { created <- d.create(parent, prefix, []byte(req.Owner)) }()
	var path string
	select {
	case r := <-created:
		if r.err != nil {
			if r.unknown {
				d.discard(parent, prefix, "", nil)
			}
			return driver.Grant{}, queuelock.WrapCtx(ctx, "zklock: create", r.err)
		}
		path = r.path
	case <-ctx.Done():
		// The create may still succeed: delete whatever it makes.
		d.discard(parent, prefix, "", created)
		return driver.Grant{}, fmt.Errorf("zklock: create: %w", ctx.Err())
	}
	g, err := d.wait(ctx, sess, parent, path, wait, start, req.LockDelay)
	if err != nil {
		d.discard(parent, prefix, path, nil)
		return driver.Grant{}, err
	}
	return g, nil
}

type createResult struct {
	path    string
	err     error
	unknown bool // the node may exist
}

// create makes the ephemeral sequential node parent/prefix<seq>, creating
// missing parents, and finds it again by its prefix when the reply was lost.
func (d *Driver) create(parent, prefix string, data []byte) createResult {
	var err error
	for range 5 {
		var p string
		p, err = d.conn.Create(parent+"/"+prefix, data, zk.FlagEphemeralSequential, d.acl)
		switch {
		case err == nil:
			return createResult{path: p}
		case errors.Is(err, zk.ErrNoNode):
			if perr := d.ensureParents(parent); perr != nil {
				return createResult{err: perr}
			}
		case errors.Is(err, zk.ErrSessionExpired):
			// The node cannot exist; try again in the new session.
		case connLoss(err):
			p, ferr := d.find(parent, prefix)
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
func (d *Driver) ensureParents(parent string) error {
	_, err := d.conn.CreateContainer(parent, nil, zk.FlagContainer, d.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if i := strings.LastIndexByte(parent, '/'); i > 0 {
			if err := d.ensureParents(parent[:i]); err != nil {
				return err
			}
			_, err = d.conn.CreateContainer(parent, nil, zk.FlagContainer, d.acl)
		}
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("zklock: create %s: %w", parent, err)
	}
	return nil
}

// find returns the path of parent's child whose name starts with prefix, or
// "" when there is none.
func (d *Driver) find(parent, prefix string) (string, error) {
	children, _, err := d.conn.Children(parent)
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

// queue returns the lock nodes among children, in queue order.
func queue(children []string) []string {
	type entry struct {
		name string
		seq  int64
	}
	var es []entry
	for _, c := range children {
		m := contender.FindStringSubmatch(c)
		if m == nil {
			continue
		}
		seq, _ := strconv.ParseInt(m[1], 10, 64)
		es = append(es, entry{c, seq})
	}
	slices.SortFunc(es, func(a, b entry) int {
		if a.seq != b.seq {
			return int(a.seq - b.seq)
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.name
	}
	return out
}

// wait reads the queue and, when the node at path is not first and wait is
// set, waits for its predecessors to go.
func (d *Driver) wait(ctx context.Context, sess *session, parent, path string, wait bool, start time.Time, delay time.Duration) (driver.Grant, error) {
	own := path[len(parent)+1:]
	// The node's stat (its czxid) and the queue in one round trip.
	type statRes struct {
		st  *zk.Stat
		err error
	}
	stc := make(chan statRes, 1)
	statNode := func() {
		ok, st, err := d.conn.Exists(path)
		if err == nil && !ok {
			st = nil
		}
		stc <- statRes{st, err}
	}
	go statNode()
	var stat *zk.Stat
	for {
		sent := time.Now()
		children, err := do(ctx, func() ([]string, error) {
			c, _, err := d.conn.Children(parent)
			return c, err
		})
		if err != nil {
			if retry, err := d.waitFailed(ctx, sess, "zklock: list queue", err); !retry {
				return driver.Grant{}, err
			}
			continue
		}
		sess.Refresh(sent)
		if stat == nil {
			var r statRes
			select {
			case r = <-stc:
			case <-ctx.Done():
				return driver.Grant{}, fmt.Errorf("zklock: stat: %w", ctx.Err())
			}
			if r.err != nil {
				if sess.Lost() {
					return driver.Grant{}, fmt.Errorf("zklock: while waiting: %w", sess.Cause())
				}
				if errors.Is(r.err, zk.ErrSessionExpired) {
					return driver.Grant{}, fmt.Errorf("zklock: stat %s: %v: %w", path, r.err, driver.ErrSessionLost)
				}
				if connLoss(r.err) && d.ctx.Err() == nil {
					if err := pause(ctx); err != nil {
						return driver.Grant{}, err
					}
					go statNode()
					continue
				}
				return driver.Grant{}, fmt.Errorf("zklock: stat %s: %w", path, r.err)
			}
			stat = r.st
			if stat == nil {
				return driver.Grant{}, fmt.Errorf("zklock: node %s vanished: %w", path, driver.ErrSessionLost)
			}
			if stat.EphemeralOwner != sess.id {
				// The session changed between our look and the create.
				if sess, err = d.session(ctx); err != nil {
					return driver.Grant{}, err
				}
				if stat.EphemeralOwner != sess.id {
					return driver.Grant{}, fmt.Errorf("zklock: node %s belongs to session %#x, not %#x: %w", path, stat.EphemeralOwner, sess.id, driver.ErrSessionLost)
				}
			}
		}
		q := queue(children)
		i := slices.Index(q, own)
		switch {
		case i < 0:
			if sess.Lost() {
				return driver.Grant{}, fmt.Errorf("zklock: while waiting: %w", sess.Cause())
			}
			return driver.Grant{}, fmt.Errorf("zklock: node %s was deleted while waiting: %w", path, driver.ErrSessionLost)
		case i == 0 && slices.Contains(children, guardName):
			// An earlier holder asked for a lock-delay: is it still running?
			left, err := d.checkGuard(ctx, parent, own)
			if err != nil {
				if connLoss(err) && !sess.Lost() && d.ctx.Err() == nil {
					if err := pause(ctx); err != nil {
						return driver.Grant{}, err
					}
					continue
				}
				return driver.Grant{}, queuelock.WrapCtx(ctx, "zklock: lock-delay guard", err)
			}
			if left == 0 {
				continue // guard gone: look again
			}
			if left < 0 {
				return d.grant(&handle{path: path, czxid: stat.Czxid, sess: sess}, 1, sent), nil
			}
			if !wait {
				return driver.Grant{}, &driver.LockedError{RetryAfter: left}
			}
			t := time.NewTimer(left)
			select {
			case <-t.C:
				continue
			case <-sess.Done():
				t.Stop()
				return driver.Grant{}, fmt.Errorf("zklock: while waiting: %w", sess.Cause())
			case <-ctx.Done():
				t.Stop()
				return driver.Grant{}, fmt.Errorf("zklock: wait: %w", ctx.Err())
			case <-d.ctx.Done():
				t.Stop()
				return driver.Grant{}, errors.New("zklock: driver is closed")
			}
		case i == 0:
			h := &handle{path: path, czxid: stat.Czxid, sess: sess}
			if delay > 0 {
				if err := d.setGuard(ctx, h, delay); err != nil {
					return driver.Grant{}, err
				}
			}
			return d.grant(h, 1, sent), nil
		case !wait:
			return driver.Grant{}, &driver.LockedError{}
		}
		pred := parent + "/" + q[i-1]
		type watchRes struct {
			ok bool
			ch <-chan zk.Event
		}
		w, err := do(ctx, func() (watchRes, error) {
			ok, _, ch, err := d.conn.ExistsW(pred)
			return watchRes{ok, ch}, err
		})
		if err != nil {
			if retry, err := d.waitFailed(ctx, sess, "zklock: watch predecessor", err); !retry {
				return driver.Grant{}, err
			}
			continue
		}
		if !w.ok {
			continue
		}
		select {
		case <-w.ch:
		case <-sess.Done():
			return driver.Grant{}, fmt.Errorf("zklock: while waiting: %w", sess.Cause())
		case <-ctx.Done():
			return driver.Grant{}, fmt.Errorf("zklock: wait: %w", ctx.Err())
		case <-d.ctx.Done():
			return driver.Grant{}, errors.New("zklock: driver is closed")
		}
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
	return false, queuelock.WrapCtx(ctx, what, err)
}

// discard deletes the node parent/prefix<seq> in the background: path when
// known, else whatever child has the prefix (after pending, when not nil,
// delivers the outcome of a create still in flight). It keeps trying until
// the node is gone, the session that made it has ended, or the driver
// closes, so no error path leaves a node blocking the queue.
func (d *Driver) discard(parent, prefix, path string, pending <-chan createResult) {
	sess := d.currentSession()
	if pending == nil {
		// Try at once, so that a failed TryAcquire leaves nothing behind
		// when it returns.
		ctx, cancel := context.WithTimeout(d.ctx, cleanupTimeout)
		_, err := do(ctx, func() (struct{}, error) { return struct{}{}, d.tryDiscard(parent, prefix, path) })
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
			if d.tryDiscard(parent, prefix, path) == nil {
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

func (d *Driver) tryDiscard(parent, prefix, path string) error {
	if path == "" {
		var err error
		if path, err = d.find(parent, prefix); err != nil || path == "" {
			return err
		}
	}
	err := d.conn.Delete(path, -1)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

func (d *Driver) currentSession() *session {
	d.smu.Lock()
	defer d.smu.Unlock()
	return d.sess
}

// Release implements driver.Driver. The last release deletes the holder's
// own node (its path is unique: GUID and sequence number), so it can never
// delete a newer holder's node.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	hd, ok := l.Handle.(*handle)
	if !ok || hd == nil {
		return 0, fmt.Errorf("zklock: release: foreign handle %T: %w", l.Handle, driver.ErrNotHeld)
	}
	n, nested, err := d.holds.Release(l.Name, l.Owner, hd, d.checker(ctx),
		func() error { return fmt.Errorf("zklock: node %s is gone: %w", hd.path, driver.ErrNotHeld) })
	if nested || err != nil {
		return n, err
	}
	_, err = do(ctx, func() (struct{}, error) { return struct{}{}, d.deleteHeld(hd) })
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return 0, fmt.Errorf("zklock: node %s is gone: %w", hd.path, driver.ErrNotHeld)
	case errors.Is(err, zk.ErrBadVersion):
		return 0, fmt.Errorf("zklock: node %s was changed by someone else: %w", hd.path, driver.ErrNotHeld)
	case err != nil:
		return 0, queuelock.WrapCtx(ctx, "zklock: release", err)
	}
	return 0, nil
}

// renewParallel bounds the requests one Renew has in flight.
const renewParallel = 64

// renewMultiMin is the batch size from which Renew checks nodes with multi
// requests rather than one Exists each; renewMultiOps is how many check
// operations one multi carries (well under ZooKeeper's 1MB packet limit).
const (
	renewMultiMin = 64
	renewMultiOps = 1000
)

// Renew implements driver.Driver. The session is kept alive by go-zookeeper's
// pings; Renew proves it alive and each node still in place. A small batch
// sends one Exists per node, pipelined on the connection (one round trip of
// latency); a large one sends multi requests of up to 1000 check operations
// each, all at once, and falls back to Exists for a multi that fails (some
// node is gone).
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	errs := make([]error, len(ls))
	hds := make([]*handle, len(ls))
	var live []int
	for i, l := range ls {
		hd, ok := l.Handle.(*handle)
		if !ok || hd == nil {
			errs[i] = fmt.Errorf("zklock: renew: foreign handle %T: %w", l.Handle, driver.ErrNotHeld)
			continue
		}
		if hd.sess.Lost() {
			errs[i] = fmt.Errorf("%w: %w", driver.ErrNotHeld, hd.sess.Cause())
			continue
		}
		hds[i] = hd
		live = append(live, i)
	}
	sem := make(chan struct{}, renewParallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	unknown := 0
	var firstErr error
	checked := make([]bool, len(ls))
	exists := func(i int) {
		hd := hds[i]
		sent := time.Now()
		st, err := do(ctx, func() (*zk.Stat, error) {
			ok, st, err := d.conn.Exists(hd.path)
			if err == nil && !ok {
				st = nil
			}
			return st, err
		})
		if err == nil && d.conn.SessionID() == hd.sess.id {
			hd.sess.Refresh(sent)
		}
		mu.Lock()
		defer mu.Unlock()
		checked[i] = true
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("zklock: renew: %w", err)
			unknown++
			firstErr = err
		case st == nil || st.Czxid != hd.czxid:
			errs[i] = fmt.Errorf("zklock: node %s is gone: %w", hd.path, driver.ErrNotHeld)
		case st.EphemeralOwner != hd.sess.id:
			errs[i] = fmt.Errorf("zklock: node %s outlived its session: %w", hd.path, driver.ErrNotHeld)
		}
	}
	run := func(f func()) bool {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		wg.Go(func() {
			defer func() { <-sem }()
			f()
		})
		return true
	}
	if len(live) < renewMultiMin {
		for _, i := range live {
			if !run(func() { exists(i) }) {
				break
			}
		}
	} else {
		for start := 0; start < len(live); start += renewMultiOps {
			chunk := live[start:min(start+renewMultiOps, len(live))]
			ok := run(func() {
				ops := make([]any, len(chunk))
				for j, i := range chunk {
					ops[j] = &zk.CheckVersionRequest{Path: hds[i].path, Version: -1}
				}
				sent := time.Now()
				_, err := do(ctx, func() ([]zk.MultiResponse, error) { return d.conn.Multi(ops...) })
				switch {
				case err == nil:
					hds[chunk[0]].sess.Refresh(sent)
					// Every node exists: paths are unique, so they are ours.
					mu.Lock()
					for _, i := range chunk {
						checked[i] = true
					}
					mu.Unlock()
				case errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion):
					for _, i := range chunk { // some node is gone: find which
						exists(i)
					}
				default:
					mu.Lock()
					for _, i := range chunk {
						checked[i] = true
						errs[i] = fmt.Errorf("zklock: renew: %w", err)
					}
					unknown += len(chunk)
					firstErr = err
					mu.Unlock()
				}
			})
			if !ok {
				break
			}
		}
	}
	wg.Wait()
	for _, i := range live {
		if !checked[i] { // not sent before ctx ended
			errs[i] = fmt.Errorf("zklock: renew: %w", ctx.Err())
			unknown++
			firstErr = ctx.Err()
		}
	}
	if len(live) > 0 && unknown == len(ls) {
		return nil, queuelock.WrapCtx(ctx, "zklock: renew", firstErr)
	}
	return errs, nil
}

// Close implements driver.Driver: it waits a few seconds at most for pending
// deletes of abandoned queue nodes, then stops the driver's goroutines. It
// closes the connection (ending the session, which deletes its nodes) only
// when the driver opened it (through a URL).
func (d *Driver) Close() error {
	deadline := time.Now().Add(cleanupTimeout)
	for d.discards.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	d.kill()
	if d.ownsConn {
		d.conn.Close()
	}
	return nil
}

// kill stops the driver's goroutines without any cleanup (also the test hook
// for a crash).
func (d *Driver) kill() { d.bg.Stop() }

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
