// Package quorum is a dlock driver that takes one lock on a majority of N
// independent backends of any kinds: three Redis masters, two PostgreSQL
// primaries and an SQLite file, or any mix of drivers that can raise their
// fencing counter (driver.FenceRaiser). It generalises Redlock (package
// redlock) from Redis masters to any dlock driver, so that no single server
// is a point of failure.
//
// Import it for its side effect to make the quorum: URL scheme available to
// dlock.Open, with each node's URL query-escaped and its driver imported:
//
//	import (
//		_ "github.com/dlock/dlock/quorum"
//		_ "github.com/dlock/dlock/redislock"
//	)
//
//	client, err := dlock.Open(ctx, "quorum:?node=redis%3A%2F%2Fh1%3A6379&node=redis%3A%2F%2Fh2%3A6379&node=redis%3A%2F%2Fh3%3A6379")
//
// or build a driver over drivers you already have with New.
//
// # The algorithm
//
// An acquire sends the request to every node in parallel, each call bounded
// by a per-node timeout much shorter than the TTL. It succeeds when a
// majority (N/2+1) of nodes granted it; the lease's validity is its TTL
// minus the Client's drift, counted from when the requests were sent
// (Grant.Sent), and the dlock package releases a grant that comes back
// after it. Otherwise the acquire is undone on every node that granted it or
// whose reply was lost, and reported as held (ErrLocked, with a retry hint)
// or, when more than N − majority nodes failed, as an error. Once a majority
// granted, the other nodes get as long again as the majority took; later
// answers are handled in the background (a late grant joins the lease, or is
// released if the lease was released meanwhile, so that no release
// overtakes its acquire). Renewal goes to every node that granted and is
// confirmed when a majority renewed; a lease is gone (ErrNotHeld) once more
// than N − majority nodes report it gone. Release goes to every node that
// granted or may have. Renew and Release return once the outcome is known,
// so a hung node slows neither down.
//
// # Fencing
//
// Each node keeps its own fencing counter. The token of a grant is the
// largest token among the granting nodes, and before the grant is returned
// a majority of the granting nodes must have a counter of at least the token:
// when those whose own token it is are fewer, others are raised to it
// (driver.FenceRaiser) until enough confirmed; every other node is raised in
// the background. Any two
// majorities intersect, so the next grant of the name is granted, on some
// node, after this grant ended there and after that node's counter reached
// this token: its token is larger. docs/quorum.md has the proof, and the
// patterns of node restarts it survives (a node restarted empty loses its
// counter).
//
// # Loss
//
// Renewal finds a lease gone on a majority. When enough granting nodes
// report loss on their own (Grant.Lost: session-bound nodes), the grant's
// Lost closes as soon as fewer than a majority of them still hold it.
//
// # Re-entry
//
// A request by an owner that holds the lock re-enters it when a majority of
// nodes re-entered; it keeps the lease's token. When fewer did, the holds
// the owner has on some nodes are leftovers of an attempt whose undo never
// reached them: they are released and the attempt starts afresh, so a
// leftover is never re-entered into a token lower than a later grant's.
//
// # Waiting and kinds
//
// The driver is a driver.Notifier when any node is: a release notified by
// any node wakes the waiter; a refusal's retry hint is when a majority of
// nodes could be free. It takes mutexes only (see SupportsKind): the holders
// of a read/write lock or a semaphore are concurrent, and independent
// counters cannot order their tokens.
package quorum

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// MinNodes is the fewest nodes a quorum driver takes.
const MinNodes = 3

// MaxNodeTimeout caps the default per-node timeout.
const MaxNodeTimeout = 500 * time.Millisecond

// Options configure a Driver. The zero value (or nil) gives the defaults.
type Options struct {
	// NodeTimeout bounds each node's part of an acquire, raise, release or
	// undo (URL parameter node_timeout). It should be much shorter than the
	// TTL, so that a dead node costs little of the validity. Default:
	// TTL/10, at most MaxNodeTimeout (500ms). Renewal gives each node up to
	// a third of the shortest lease's TTL instead, since a batch of many
	// leases takes longer than one acquire.
	NodeTimeout time.Duration
	// Names, if not nil, names the nodes in errors (one per driver, in
	// order); it must not hold credentials. Default "node i (type)". OpenURL
	// sets each node's URL with its secrets masked.
	Names []string
}

// Driver is a lock over a majority of independent node drivers. It
// implements driver.Driver, driver.Notifier, driver.Inspector,
// driver.NameChecker, driver.Limiter, driver.Kinder (mutexes only) and
// driver.FenceRaiser, each by fanning out to the nodes, and is safe for
// concurrent use. It owns its nodes: Close closes them.
type Driver struct {
	nodes       []*node
	quorum      int
	nodeTimeout time.Duration

	gate  gate
	done  chan struct{} // closed when Close begins: background work stops
	recs  records       // live grants' quorum tokens, for re-entry
	late  lateUndos     // undoLate's work in flight, by name, kind and owner
	strag stragglers    // undoLate's work in flight, by name, kind and node
	close sync.Once
	cerr  error
}

type node struct {
	d    driver.Driver
	name string
}

var (
	_ driver.Driver      = (*Driver)(nil)
	_ driver.Notifier    = (*Driver)(nil)
	_ driver.Inspector   = (*Driver)(nil)
	_ driver.NameChecker = (*Driver)(nil)
	_ driver.Limiter     = (*Driver)(nil)
	_ driver.Kinder      = (*Driver)(nil)
	_ driver.FenceRaiser = (*Driver)(nil)
)

// New returns a quorum driver over drivers, one per independent backend.
// It takes at least MinNodes (3) drivers; an odd number is the useful
// choice: N nodes tolerate (N−1)/2 failures, and an even N tolerates no
// more failures than N−1 (4 nodes need 3, as 5 do) while adding a node
// that can fail. The driver owns the drivers: its Close closes them, also
// when New fails.
//
// Fewer than 3 drivers, a nil or repeated driver, or a bad Options field is
// refused with an error wrapping driver.ErrInvalid; a driver that cannot
// raise its fencing counter (it does not implement driver.FenceRaiser: etcd
// and ZooKeeper, whose tokens are server revisions) with an error wrapping
// driver.ErrUnsupported that names the node.
func New(drivers []driver.Driver, o *Options) (*Driver, error) {
	d, err := build(drivers, o)
	if err != nil {
		for _, nd := range drivers {
			if nd != nil {
				_ = nd.Close()
			}
		}
		return nil, err
	}
	return d, nil
}

func build(drivers []driver.Driver, o *Options) (*Driver, error) {
	if len(drivers) < MinNodes {
		return nil, openurl.Invalid("drivers", "quorum: %d nodes given, at least %d are needed (an odd number: N nodes tolerate (N-1)/2 failures)", len(drivers), MinNodes)
	}
	if o == nil {
		o = &Options{}
	}
	if o.NodeTimeout < 0 {
		return nil, openurl.Invalid("NodeTimeout", "quorum: invalid NodeTimeout %v: must not be negative", o.NodeTimeout)
	}
	if o.Names != nil && len(o.Names) != len(drivers) {
		return nil, openurl.Invalid("Names", "quorum: %d names for %d nodes", len(o.Names), len(drivers))
	}
	d := &Driver{quorum: len(drivers)/2 + 1, nodeTimeout: o.NodeTimeout, done: make(chan struct{})}
	for i, nd := range drivers {
		name := fmt.Sprintf("node %d", i)
		if o.Names != nil {
			name = fmt.Sprintf("node %d (%s)", i, o.Names[i])
		} else if nd != nil {
			name = fmt.Sprintf("node %d (%T)", i, nd)
		}
		if nd == nil {
			return nil, openurl.Invalid("drivers", "quorum: %s is nil", name)
		}
		if reflect.TypeOf(nd).Comparable() {
			for j, prev := range d.nodes {
				if reflect.TypeOf(prev.d) == reflect.TypeOf(nd) && prev.d == nd {
					return nil, openurl.Invalid("drivers", "quorum: %s is the same driver as node %d", name, j)
				}
			}
		}
		if _, ok := nd.(driver.FenceRaiser); !ok {
			return nil, fmt.Errorf("quorum: %s cannot raise its fencing counter (no driver.FenceRaiser), so tokens could not be kept increasing across nodes; use nodes whose tokens are counters (Redis, PostgreSQL, MySQL, SQLite, mem), not server revisions (etcd, ZooKeeper): %w", name, driver.ErrUnsupported)
		}
		d.nodes = append(d.nodes, &node{d: nd, name: name})
	}
	return d, nil
}

// Quorum returns the number of nodes a grant or renewal must reach: N/2+1.
func (d *Driver) Quorum() int { return d.quorum }

// Nodes returns the node drivers, in order. They belong to d.
func (d *Driver) Nodes() []driver.Driver {
	out := make([]driver.Driver, len(d.nodes))
	for i, n := range d.nodes {
		out[i] = n.d
	}
	return out
}

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
var errClosed = fmt.Errorf("quorum: %w", dlock.ErrClosed)

// Close refuses new calls, waits for the calls in flight (each bounded by
// the node timeouts; an acquire that completes meanwhile is undone on every
// node, not returned) and for the background work they started (late
// nodes' answers, fence raises, loss watches), then closes every node
// driver, each of which releases what it still holds as its own Close
// does. It returns the first node's error. Close is idempotent.
func (d *Driver) Close() error {
	d.close.Do(func() {
		close(d.done)
		d.gate.stop()
		for _, n := range d.nodes {
			if err := n.d.Close(); err != nil && d.cerr == nil {
				d.cerr = fmt.Errorf("quorum: close %s: %w", n.name, err)
			}
		}
	})
	return d.cerr
}

// gate admits calls until stop, which then waits for them and for the
// background work they started.
type gate struct {
	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	return true
}

func (g *gate) exit() { g.wg.Done() }

// spawn runs fn in a goroutine that stop waits for. Call it only inside an
// admitted call (or a goroutine spawn started).
func (g *gate) spawn(fn func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
}

func (g *gate) isStopped() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stopped
}

func (g *gate) stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.wg.Wait()
}

// result is one node's answer to a fanned-out call.
type result[T any] struct {
	i   int
	v   T
	err error
}

// fanout runs fn on the nodes listed (all when which is nil) in parallel,
// each bounded by timeout, and returns a channel that receives one result
// per node in the order they arrive. Close waits for the calls, so it must
// be called inside an admitted call.
func fanout[T any](d *Driver, ctx context.Context, timeout time.Duration, which []int, fn func(ctx context.Context, i int, n driver.Driver) (T, error)) <-chan result[T] {
	if which == nil {
		which = make([]int, len(d.nodes))
		for i := range which {
			which[i] = i
		}
	}
	out := make(chan result[T], len(which))
	for _, i := range which {
		n := d.nodes[i]
		d.gate.spawn(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			v, err := fn(nctx, i, n.d)
			if err != nil {
				if nctx.Err() != nil && ctx.Err() == nil && !errors.Is(err, driver.ErrLocked) {
					err = fmt.Errorf("no answer within the %v node timeout: %w", timeout, err)
				}
				err = fmt.Errorf("%s: %w", n.name, err)
			}
			cancel()
			out <- result[T]{i: i, v: v, err: err}
		})
	}
	return out
}

// definite reports whether err is an answer rather than a lost reply: the
// node refused (ErrLocked) or refused the request as bad (ErrInvalid,
// ErrUnsupported), so nothing was granted there.
func definite(err error) bool {
	return errors.Is(err, driver.ErrLocked) || errors.Is(err, driver.ErrInvalid) || errors.Is(err, driver.ErrUnsupported)
}
