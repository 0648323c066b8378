// Package redlock is the dlock driver for Redlock: one lock taken on a
// majority of N independent Redis masters, as antirez described it.
//
// Import it for its side effect to make the redlock:// URL scheme available
// to dlock.Open:
//
//	import _ "github.com/dlock/dlock/redlock"
//
//	client, err := dlock.Open(ctx, "redlock://h1:6379,h2:6379,h3:6379")
//
// or construct a driver over go-redis clients you already have with New.
// The nodes must be independent masters (not replicas of each other, not
// one cluster): Redlock's fault tolerance comes from their independence.
//
// # The algorithm
//
// An acquire sends the same Lua script as the redislock driver (same key
// layout, owner token, PX expiry, re-entrance count, lock-delay) to every
// node in parallel, each call bounded by a per-node timeout much shorter
// than the TTL. It succeeds when a quorum of N/2+1 nodes granted it.
// Otherwise it releases on every node that granted (or may have granted) at
// once and reports the lock as held (ErrLocked, with a retry hint) or, when
// fewer than a quorum of nodes answered, as an error. Renewal must reach a
// quorum, or the lease is not confirmed; release goes to every node. A
// release goes to each node once that node has answered the acquire (or
// given up on it), so it cannot overtake a slow node's acquire and leave
// the lock held there; the nodes that answered are released at once.
//
// A grant's validity is its TTL minus a drift margin, measured from when
// the acquire was sent. The dlock package keeps that deadline, with the
// drift of dlock.Options.Drift (default TTL/100 + 2ms, Redlock's), and
// releases a grant that arrives after it; the driver has no drift of its
// own, so the one the user chose decides.
//
// A key that dlock did not write at a lock's keys on a node is, on that
// node, a lock held by an unknown owner, as in the redislock driver: it is
// never overwritten, counts as a refusal, and shows as "?" in Inspect when
// a quorum of nodes has one. Close releases on every node whatever the
// driver granted and nobody released, grants completing while Close began
// included, before it closes its connections. A release that some node did
// not answer within the node timeout (an Unlock's, or the undo of a failed
// acquire's partial grants) leaves the grant in the driver's book for
// Close to release there.
//
// # Fencing
//
// Each node keeps its own fencing counter, incremented by the acquire
// script. The token of a grant is the maximum counter returned by the
// granting nodes, which is one more than the largest counter among them,
// and it is written back (each counter raised to at least the token) to a
// quorum before the grant is returned. Any two quorums intersect, so a later
// grant sees a counter at least this token on some node and gets a larger
// one, provided (1) the write-back finished while the grant was still valid
// (the dlock package checks this on its monotonic clock, since the grant is
// returned only after the write-back, under Redlock's usual
// assumption that the nodes' clocks run at nearly the same rate), and (2) no
// node lost its counter: a node restarted empty resets its counter to 0.
// Run the nodes with appendonly yes and appendfsync always, or restart a
// crashed node only after the longest TTL in use has passed and with its
// old data; see docs/backends.md.
//
// # Waiting
//
// A waiting Lock (Driver.Acquire) queues on every node at one score, its
// first refusal's time by its own clock, so all nodes order the waiters
// alike and a free node grants only to the first live waiter: waiters do
// not split the nodes between them, and a holder asking again goes behind
// them. A release wakes that waiter only; its acquire goes to each node as
// soon as that node's release names it (to all of them once a quorum has
// been sent to), so no acquire reaches a node ahead of its release. The
// queue keys are redislock's.
//
// A waiting Lock also asks each node, with every refused attempt, to grant
// it the lock in the release that frees it (grant-in-release): the
// driver's release script then gives the lock to the first queued waiter
// that asked, with a new token, and publishes the grant on that waiter's
// driver's own channel, but only if the message reached it (a crashed
// waiter is woken, never granted). The waiter holds the lock once a quorum
// of nodes granted it by releasing one grant, without another round of
// acquires, and counts its lease from the send time of its last refused
// attempt on each node, which the grant is proven to follow (its token is
// above the fencing counter that refusal reported). Anything short of that
// (a minority, grants made by different releases, less than two thirds
// of the TTL left) falls back to an attempt, which adopts the grants with
// fresh tokens and gives back a minority. Waiters of clients that do not
// ask for grants share the nodes safely and are woken as before. See
// docs/protocol.md for the keys, scripts and message.
//
// # Lock types
//
// Read/write locks (dlock.RWMutex) run the same algorithm with redislock's
// read and write scripts on every node: a reader and a writer each need a
// quorum, any two quorums share a node, and on that node a reader and a
// writer never hold at once, so exclusion holds as it does for mutexes.
// Reads and writes share one counter per node, and the token of either
// side is chosen, written back (into the counter and the holder's own
// place) and re-entered exactly as a mutex's, leftover rule included. A
// refused waiting writer is marked on every node (the nodes whose grant
// was undone get the mark too), so new readers are held back on a quorum;
// Withdraw removes the marks everywhere. Releases wake waiters of every
// kind through the nodes' release channels.
//
// Semaphores are not supported (SupportsKind(driver.Permit) is false, and
// dlock.Semaphore fails with ErrUnsupported): with every node admitting up
// to P holders and each holder needing a quorum q of N nodes, up to
// ⌊P·N/q⌋ holders could hold a quorum each at once. A MultiMutex is taken
// one name at a time (the driver has no driver.MultiAcquirer: one script
// cannot be atomic across independent nodes).
package redlock

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/redislane"
	"github.com/dlock/dlock/internal/redisscript"
)

// DefaultKeyPrefix is the prefix of every key and channel when
// Options.KeyPrefix is empty.
const DefaultKeyPrefix = redisscript.DefaultPrefix

// MaxNodeTimeout caps the default per-node timeout.
const MaxNodeTimeout = 500 * time.Millisecond

// Options configure a Driver. The zero value (or nil) gives the defaults.
// Each field maps to the URL query parameter named in its comment.
type Options struct {
	// KeyPrefix is prepended to every key and channel on every node (URL
	// parameter key_prefix). It must not contain '{', '}', glob characters
	// (*?[]\) or control characters. Default "dlock:".
	KeyPrefix string
	// NodeTimeout bounds each node's part of an acquire, release or
	// write-back (URL parameter node_timeout). It should be much shorter
	// than the TTL, so that a dead node costs little of the validity.
	// Default: TTL/10, at most MaxNodeTimeout (500ms). An acquire returns
	// as soon as a quorum granted it, so a hung node delays only failed
	// acquires and releases by this much. Renewal gives each
	// node up to a third of the shortest lease's TTL instead, since a batch
	// of many leases takes longer than one acquire.
	NodeTimeout time.Duration
}

// Driver is a Redlock dlock driver over N go-redis clients, one per
// independent Redis master. It implements driver.Driver, driver.Notifier,
// driver.Queuer, driver.Inspector, driver.Limiter, driver.Kinder (mutexes
// and read/write locks) and driver.Withdrawer, and is safe for concurrent
// use.
type Driver struct {
	nodes       []*node
	quorum      int
	prefix      string
	nodeTimeout time.Duration
	own         bool // Close closes the clients (opened from a URL)

	gate      redisscript.Gate   // Close waits for calls and node calls in flight, refuses new calls
	grants    redisscript.Grants // granted and not released: Close releases them
	seen      dedupe             // release messages already delivered
	listeners listeners          // the channels waiting Locks listen on
	closing   chan struct{}      // closed when Close begins
	// workers hands node calls to idle worker goroutines (see spawn);
	// stopWorkers, closed when Close ends, stops them.
	workers     chan job
	stopWorkers chan struct{}
	stopOnce    sync.Once
	closeOnce   sync.Once
	// grantCh is the channel the nodes publish this driver's waiters'
	// grants on (see grant.go); grantSubs tells on which nodes it is
	// subscribed, under grantMu; grantSig is its subscriptions' (unused)
	// wake-up channel.
	grantCh    string
	grantMu    sync.Mutex
	grantSubs  []bool
	grantTried []time.Time
	grantSig   chan struct{}
	// grantsTaken counts the waiting Locks that took the lock on grant
	// messages (for tests).
	grantsTaken atomic.Int64
	// attemptsBegun and attemptsEnded count the attempts of waiting Locks
	// (for tests: whether one was in flight).
	attemptsBegun, attemptsEnded atomic.Int64
	// renewWait, if not zero, replaces queueWait/3 as the longest a
	// waiter waits between attempts (for tests: a long one leaves only the
	// mechanism under test to end a wait).
	renewWait time.Duration
	closeErr  error
}

type node struct {
	i int // its index in Driver.nodes
	// client is the node's go-redis client, its script calls on lane
	// when there is one (see redislane.Wrap): back-to-back node calls
	// skip go-redis's per-command pool check.
	client redis.UniversalClient
	lane   *redislane.Lane
	hub    *redisscript.Hub
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Notifier  = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
	_ driver.Limiter   = (*Driver)(nil)
)

// New returns a Redlock driver over clients, one per independent master.
// An odd number of at least three is the useful choice: N nodes tolerate
// (N−1)/2 failures. Close does not close the clients.
//
// Give the clients ContextTimeoutEnabled: true and MaxRetries: -1. With
// context timeouts a slow node is cut off at the per-node timeout; without
// them the driver stops waiting for it anyway, but the call runs on in the
// background until go-redis's ReadTimeout. Without retries, a script whose
// reply was lost is not run a second time.
//
// No clients, a nil or repeated client, or a bad Options field is refused
// with an error wrapping driver.ErrInvalid.
func New(clients []redis.UniversalClient, o *Options) (*Driver, error) {
	if len(clients) == 0 {
		return nil, openurl.Invalid("clients", "redlock: no clients")
	}
	d := &Driver{quorum: len(clients)/2 + 1, prefix: DefaultKeyPrefix, closing: make(chan struct{}), workers: make(chan job), stopWorkers: make(chan struct{})}
	d.seen.quorum = d.quorum
	d.grantSig = make(chan struct{}, 1)
	if o != nil {
		if o.KeyPrefix != "" {
			d.prefix = o.KeyPrefix
		}
		if o.NodeTimeout < 0 {
			return nil, openurl.Invalid("NodeTimeout", "redlock: invalid NodeTimeout %v: must not be negative", o.NodeTimeout)
		}
		d.nodeTimeout = o.NodeTimeout
	}
	if err := redisscript.CheckPrefix(d.prefix); err != nil {
		return nil, openurl.Invalid("KeyPrefix", "redlock: invalid KeyPrefix: %w", err)
	}
	d.grantCh = redisscript.NewGrantChannel(d.prefix)
	d.grantSubs = make([]bool, len(clients))
	d.grantTried = make([]time.Time, len(clients))
	for i, c := range clients {
		if c == nil {
			return nil, openurl.Invalid("clients", "redlock: client %d is nil", i)
		}
		for _, prev := range clients[:i] {
			if prev == c {
				return nil, openurl.Invalid("clients", "redlock: client %d is given twice", i)
			}
		}
	}
	for i, c := range clients {
		scripts, lane := redislane.Wrap(c)
		d.nodes = append(d.nodes, &node{i: i, client: scripts, lane: lane, hub: redisscript.NewHub(c, d.filterAt(i))})
	}
	return d, nil
}

// Quorum returns the number of nodes a grant or renewal must reach: N/2+1.
func (d *Driver) Quorum() int { return d.quorum }

func (d *Driver) timeoutFor(ttl time.Duration) time.Duration {
	if d.nodeTimeout > 0 {
		return d.nodeTimeout
	}
	if ttl <= 0 {
		return MaxNodeTimeout
	}
	return max(min(ttl/10, MaxNodeTimeout), time.Millisecond)
}

// errClosed is returned by calls made after Close began.
var errClosed = fmt.Errorf("redlock: %w", dlock.ErrClosed)

// handle is the driver's Grant.Handle.
type handle struct {
	// ref holds a mutex's keys in one string, shared with the driver's
	// book of grants (nil for a read or write grant); kind holds a read
	// or write grant's keys (nil for a mutex). A held lease keeps this
	// handle, so it is kept small.
	ref  *redisscript.Ref
	kind *redisscript.KindKeys
	// settled tells, while some nodes have not answered the acquire (or
	// given up on it), when each of them does: a release sent to a node
	// before then could reach it ahead of its acquire, which would then
	// grant there after the release and hold that node until TTL. It is
	// dropped (nil) once every node answered, so that a held lease does
	// not keep it.
	settled atomic.Pointer[settling]
}

// settling is a grant's acquire while some nodes have not answered.
type settling struct {
	mu sync.Mutex
	// pending, by node, is set while that node has not answered.
	pending []bool
	// then, by node, are what to run once that node answers (a release,
	// see after), on settle's goroutine, given the node; inline tells
	// that it is the last node settle waited for, so that the call may
	// run there rather than on another worker.
	then [][]func(i int, inline bool)
}

// after arranges for f to run once node i has answered the acquire, on
// settle's goroutine, and reports true; if node i has answered already it
// reports false and does nothing (the caller goes ahead at once).
func (s *settling) after(i int, f func(i int, inline bool)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.pending[i] {
		return false
	}
	s.then[i] = append(s.then[i], f)
	return true
}

// answered records node i's answer and returns what was waiting for it.
func (s *settling) answered(i int) []func(i int, inline bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[i] = false
	fs := s.then[i]
	s.then[i] = nil
	return fs
}

// Limits reports millisecond TTL granularity (PX).
func (d *Driver) Limits() driver.Limits {
	return driver.Limits{MinTTL: time.Millisecond, TTLGranularity: time.Millisecond}
}

// Close refuses new calls, waits for the calls (and node calls) in flight,
// releases on every node every grant the driver handed out (or was
// completing) that has not been released, then stops the driver's pub/sub
// connections. It closes the go-redis clients only if the driver opened
// them from a URL. So no lock the driver granted outlives Close, even one
// whose grant raced it; Close reports an error when such a release failed
// on some node (the lock then expires there by its TTL). Close is
// idempotent.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		close(d.closing) // a staggered attempt sends to its late nodes now
		d.gate.Stop()
		for _, u := range d.closeListeners() {
			d.releaseGrant(u.k, u.owner, u.node, u.token)
		}
		clients := make([]redis.UniversalClient, len(d.nodes))
		for i, n := range d.nodes {
			clients[i] = n.client
		}
		if err := d.grants.ReleaseAll(clients); err != nil {
			d.closeErr = fmt.Errorf("redlock: close: %w", err)
		}
		for _, n := range d.nodes {
			n.lane.Close()
			if err := n.hub.Close(); err != nil && d.closeErr == nil {
				d.closeErr = err
			}
		}
		if d.own {
			for _, n := range d.nodes {
				if err := n.client.Close(); err != nil && d.closeErr == nil {
					d.closeErr = err
				}
			}
		}
		d.stopWorkersOnce()
	})
	return d.closeErr
}

// kill drops every connection at once without releasing anything, as a
// crashed process would. For tests.
func (d *Driver) kill() {
	for _, n := range d.nodes {
		_ = n.hub.Close()
		n.lane.Close()
		_ = n.client.Close()
	}
	d.gate.Stop()
	_ = d.closeListeners()
	d.grants.Forget()
	d.stopWorkersOnce()
}

// stopWorkersOnce stops the idle worker goroutines (see spawn).
func (d *Driver) stopWorkersOnce() {
	d.stopOnce.Do(func() { close(d.stopWorkers) })
}
