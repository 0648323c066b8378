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
// kazoo stores its identifier there. With Options.Layout LayoutCurator (URL
// layout=curator) a request names its node as Apache Curator's
// InterProcessMutex does, _c_<uuid>-lock-<seq>, and shares the queue with
// Curator's InterProcessMutex(client, R + "/" + X) instead.
//
// Whatever its layout, the driver counts the nodes of both namings as the
// queue, ordered by sequence number (ZooKeeper numbers all sequential
// children of a node from one counter), so dlock never takes a lock a kazoo
// or Curator client holds. No one naming can serve both foreign clients:
// kazoo orders what follows the first "__lock__" and ignores other nodes,
// Curator orders what follows the last "lock-" in every child, so a name
// that both read as its sequence number would have to end in both markers.
// kazoo 2.7.1 and later can be told to count Curator's nodes
// (client.Lock(path, extra_lock_patterns=["-lock-"])); Curator misorders
// kazoo's nodes (it sorts them by their GUID).
//
// # Read/write locks and semaphores
//
// A name's read/write lock and semaphore live in the nodes dlock-rw and
// dlock-sem inside its mutex node, laid out as Apache Curator's
// InterProcessReadWriteLock and InterProcessSemaphoreV2 (Curator clients on
// <root>/<name>/dlock-rw and <root>/<name>/dlock-sem share them), granted by
// Curator's rules: a reader once no writer is ahead of it, a writer once it
// is first (so a waiting writer holds back later readers), a permit once no
// more leases than permits exist, taken under the semaphore's own mutex so
// that waiters queue in order. The permit count is stored as the semaphore
// node's data; a request with another count is refused with ErrInvalid
// while the semaphore is in use. Tokens are the zxid of a write each grant
// makes to its own node. Lock-delay applies per holder. See kinds.go.
//
// # Sessions, TTL and loss
//
// Every node is bound to a ZooKeeper session, and a grant lives as long as
// that session: a lock's TTL is its session's timeout. ZooKeeper negotiates
// that timeout when the session is made, clamping what the client asks for to
// the server's [minSessionTimeout, maxSessionTimeout] (2 and 20 ticks by
// default).
//
// A driver opened from a URL keeps one connection, with one session, per
// distinct TTL (in whole milliseconds): the first lock with a TTL opens a
// connection asking for exactly that session timeout, later locks with it
// share it, and Close closes them all. The timeout the server granted is read
// from its connect response, and Grant.TTL is that timeout, so every validity
// the dlock package computes is counted with what the server enforces. A TTL
// the ensemble will not grant is refused with an error wrapping
// dlock.ErrInvalid (an *dlock.InvalidArgumentError for "TTL") that names the
// bounds; it is never replaced by another. Re-entering a held lock with
// another TTL, and renewing (Extend) a lease to another TTL, are refused too
// (ErrInvalid and driver.ErrUnsupported): a node cannot move to another
// session.
//
// A driver made with New has only the connection it was given, and serves
// only locks whose TTL is Options.SessionTimeout, which must be the timeout
// the server granted that connection (not more: the driver cannot read it
// from a connection it did not open); other TTLs are refused with ErrInvalid.
//
// A connection loss only suspends: go-zookeeper reconnects, within the session
// timeout, to any server of the ensemble and the session and its nodes live
// on. When the session expires, the Lost channel of every grant made in it
// closes with a cause wrapping driver.ErrSessionLost; go-zookeeper then
// establishes a new session, which serves later locks. The driver also gives
// a session up on its own once no request has been answered for a whole
// negotiated session timeout, counted from the request's send time: by then
// the server has expired it, even if no server can be reached to say so.
//
// Each session has one loop in the driver (see watch). Every request the
// server answers refreshes a session, so there is no keepalive of its own
// to send: Renew checks that each node is still in place (a node can be
// deleted while its session lives) with requests sent after Renew was
// called, and those requests are what prove the session alive from then.
// The loop probes the session only when no request touched it for a third
// of its timeout (a session whose locks are renewed is never probed), and
// go-zookeeper's pings keep the connection itself up. A node deleted by
// someone else is found by the next Renew (driver.ErrNotHeld). Close closes
// every connection the driver opened with every socket it used, also the
// one go-zookeeper leaves open when a server refuses to resume an expired
// session.
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
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock"
)

// DefaultRoot is the node under which lock nodes live when Options.Root is
// empty.
const DefaultRoot = "/dlock"

// DefaultSessionTimeout is the session timeout New assumes for its
// connection when Options.SessionTimeout is zero.
const DefaultSessionTimeout = 10 * time.Second

// cleanupTimeout bounds how long Close waits for background cleanup.
const cleanupTimeout = 5 * time.Second

// Options configure a Driver. The zero value (or nil) gives the defaults.
type Options struct {
	// Root is the node under which every lock's node is created: the lock
	// named X lives at Root + "/" + X. It must be an absolute ZooKeeper path
	// without a trailing '/', or "/" itself. Default DefaultRoot. URL: the
	// path after the hosts.
	Root string
	// SessionTimeout, for New, is the session timeout the server granted
	// the connection: the only TTL the driver serves, and reported as
	// Grant.TTL. ZooKeeper may grant less (or more) than the timeout given to
	// zk.Connect; go-zookeeper logs the granted one ("authenticated: id=…,
	// timeout=…"). It must not exceed it, or a holder could believe it holds
	// a lock after the server has handed it on. Default
	// DefaultSessionTimeout.
	//
	// For OpenURL (session_timeout) it is the timeout asked for the first
	// connection, opened at once; the timeout granted to it is the TTL that
	// connection serves. Default 30s (dlock.DefaultTTL).
	SessionTimeout time.Duration
	// ACL is set on every node the driver creates. Default
	// zk.WorldACL(zk.PermAll). URL: acl=open (the default), acl=creator
	// (only the authenticated creator may do anything) or acl=creator_read
	// (creator all, everyone read).
	ACL []zk.ACL
	// Layout is how a mutex request names its node: LayoutKazoo (the
	// default, Python kazoo's Lock) or LayoutCurator (Apache Curator's
	// InterProcessMutex). Whatever the layout, the driver queues behind
	// nodes of both namings, so drivers with different layouts exclude each
	// other; the layout decides which foreign client sees dlock's nodes
	// (kazoo ignores Curator's names, and Curator misorders kazoo's). Every
	// client of one lock must use one naming. Read/write locks and
	// semaphores always use Curator's layouts. URL: layout=kazoo|curator.
	Layout string
}

// Driver is a dlock driver over ZooKeeper connections. It implements
// driver.Driver, driver.Queuer, driver.Inspector, driver.Limiter and
// driver.Kinder (read/write locks and semaphores in Curator's layouts, see
// kinds.go). It is safe for concurrent use. Create it with New or OpenURL.
type Driver struct {
	root   string
	acl    []zk.ACL
	layout string

	bg       *sessionlock.Group // session watchers, connects and background deletes
	ctx      context.Context    // bg's: cancelled by Close
	discards atomic.Int64       // background deletes still running
	stats    atomic.Int64       // reads of a created node's stat (its reply was not seen; see sniff.go)

	// dial opens a connection per TTL class (see conn.go); nil when the
	// driver has only fixed, the connection passed to New.
	dial       *dialer
	fixed      *link
	defaultTTL time.Duration // the class Inspect uses when none is open

	cmu     sync.Mutex
	classes map[time.Duration]*class
	links   []*link // every connection opened, in order
	bounds  bounds

	holds sessionlock.Holds[*handle] // re-entrance by (name, owner)
}

var (
	_ driver.Driver  = (*Driver)(nil)
	_ driver.Queuer  = (*Driver)(nil)
	_ driver.Limiter = (*Driver)(nil)
)

// Limits implements driver.Limiter: ZooKeeper counts session timeouts, and
// so TTLs, in whole milliseconds.
func (d *Driver) Limits() driver.Limits { return driver.Limits{TTLGranularity: time.Millisecond} }

// handle is the Grant.Handle of this driver. The driver keeps one per held
// grant, so what only a kind's grant needs is apart (k): a mutex's handle is
// 48 bytes.
type handle struct {
	path    string
	czxid   int64
	sess    *session
	k       *kindGrant  // a kind's grant (RWMutex, Semaphore); nil for a mutex's
	guarded atomic.Bool // a lock-delay guard of this grant exists (see delay.go)
}

// kindGrant is what a handle of a kind's grant keeps besides a mutex's.
type kindGrant struct {
	kind      driver.Kind
	version   int32  // the node's data version (1 once the grant wrote its token, see kinds.go)
	token     int64  // the token when it is not czxid (see kinds.go)
	guardPath string // the grant's lock-delay guard node (a mutex's is derived, see guard)
}

// kind is what h's grant holds: the zero Kind (a mutex's) unless k is set.
func (h *handle) kind() driver.Kind {
	if h.k == nil {
		return 0
	}
	return h.k.kind
}

// version is h's node's data version: 0 for a mutex's, which is never
// written after it is created.
func (h *handle) version() int32 {
	if h.k == nil {
		return 0
	}
	return h.k.version
}

// token is the grant's fencing token: czxid, or for a kind's grant the
// zxid of the write that marked it.
func (h *handle) token() int64 {
	if h.k == nil {
		return h.czxid
	}
	return cmp.Or(h.k.token, h.czxid)
}

// guard is the lock-delay guard node of h's grant: a mutex's is the lock's
// one guard, beside its node (derived rather than kept: the driver keeps a
// handle per held grant).
func (h *handle) guard() string {
	if h.k != nil && h.k.guardPath != "" {
		return h.k.guardPath
	}
	return h.path[:strings.LastIndexByte(h.path, '/')+1] + guardName
}

// New returns a driver over conn. The driver does not close conn: Close stops
// only the driver's own goroutines. opts may be nil.
func New(conn *zk.Conn, opts *Options) (*Driver, error) {
	if conn == nil {
		return nil, errors.New("zklock: New: connection is nil")
	}
	d, err := newDriver(opts)
	if err != nil {
		return nil, err
	}
	d.fixed = &link{conn: conn, fixed: msTimeout(d.defaultTTL)}
	return d, nil
}

// newDialing returns a driver that opens its own connections with dl, one
// per TTL class; first, when not nil, is one opened already.
func newDialing(dl *dialer, first *link, firstAsked, firstGot time.Duration, opts *Options) (*Driver, error) {
	d, err := newDriver(opts)
	if err != nil {
		return nil, err
	}
	d.dial = dl
	if first != nil {
		c := &class{ready: make(chan struct{}), l: first}
		close(c.ready)
		d.classes[firstGot] = c
		d.links = append(d.links, first)
		d.bounds.learn(firstAsked, firstGot)
	}
	return d, nil
}

func newDriver(opts *Options) (*Driver, error) {
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
	switch o.Layout {
	case "":
		o.Layout = LayoutKazoo
	case LayoutKazoo, LayoutCurator:
	default:
		return nil, &dlock.InvalidArgumentError{Arg: "Layout", Reason: fmt.Sprintf("zklock: layout %q is not %q or %q", o.Layout, LayoutKazoo, LayoutCurator)}
	}
	bg := sessionlock.NewGroup()
	return &Driver{
		root:       o.Root,
		layout:     o.Layout,
		defaultTTL: o.SessionTimeout,
		acl:        o.ACL,
		bg:         bg,
		ctx:        bg.Context(),
		classes:    map[time.Duration]*class{},
	}, nil
}

// Close implements driver.Driver: it waits a few seconds at most for pending
// deletes of abandoned queue nodes, then stops the driver's goroutines. It
// closes the connections the driver opened (ending their sessions, which
// deletes their nodes), with every socket they used; it never closes a
// connection passed to New.
func (d *Driver) Close() error {
	deadline := time.Now().Add(cleanupTimeout)
	for d.discards.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	d.kill()
	d.cmu.Lock()
	links := d.links
	d.links = nil
	d.cmu.Unlock()
	// In parallel: closing waits up to a second for a server's answer.
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Go(l.close)
	}
	wg.Wait()
	return nil
}

// kill stops the driver's goroutines without any cleanup (also the test hook
// for a crash).
func (d *Driver) kill() { d.bg.Stop() }
