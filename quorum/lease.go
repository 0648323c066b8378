package quorum

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// Release releases one hold on every node that granted it or may have
// (its acquire's reply was lost), after every node has answered the
// acquire. It returns the largest hold count left on any node, or
// ErrNotHeld when more than N − majority nodes did not hold the lease for
// l.Owner (it was gone on a majority, so another owner may hold it: a late
// Unlock never reports success). Release with Token 0 and a nil Handle (the
// dlock package's clean-up of an acquire whose outcome is unknown) goes to
// every node. After Close has begun it fails with an error wrapping
// dlock.ErrClosed.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if !d.gate.enter() {
		return 0, errClosed
	}
	defer d.gate.exit()
	h, _ := l.Handle.(*handle)
	left, err := d.release(ctx, l, h)
	if (err == nil && left == 0) || errors.Is(err, driver.ErrNotHeld) {
		d.recs.drop(l)
	}
	if h != nil && (err == nil || errors.Is(err, driver.ErrNotHeld)) {
		h.finish() // this hold is over, whatever others remain
	}
	return left, err
}

func (d *Driver) release(ctx context.Context, l driver.Lease, h *handle) (int, error) {
	n := len(d.nodes)
	leases := make([]*driver.Lease, n)
	if h == nil {
		for i := range leases {
			leases[i] = &driver.Lease{Name: l.Name, Owner: l.Owner, TTL: l.TTL, LockDelay: l.LockDelay, Kind: l.Kind, Permits: l.Permits}
		}
	} else {
		// Nodes that have not answered the acquire yet are left to
		// lateAnswers, which releases a late grant once released is set:
		// a release sent now could overtake the acquire there.
		h.mu.Lock()
		h.released = true
		if h.latePending && h.lateEnd == nil {
			h.lateEnd = d.late.begin(lateKey{l.Name, l.Owner, l.Kind})
		}
		for i, p := range h.nodes {
			switch {
			case p.held:
				nl := leaseOn(l, p.grant)
				leases[i] = &nl
			case p.unknown:
				leases[i] = &driver.Lease{Name: l.Name, Owner: l.Owner, TTL: l.TTL, LockDelay: l.LockDelay, Kind: l.Kind, Permits: l.Permits}
			}
		}
		h.mu.Unlock()
	}
	var which []int
	notHeld := 0
	for i, nl := range leases {
		switch {
		case nl != nil:
			which = append(which, i)
		case h == nil || h.nodes[i].refused:
			notHeld++ // never granted there
		}
	}
	// Bounded by the node timeout, not by ctx: the releases still running
	// when the outcome is known (or ctx ends) run to their end. Those by
	// owner alone (token 0: a node whose acquire reply was lost) are
	// tracked until they end, so that the owner's next attempt does not
	// have its grant on that node taken away by them (see lateUndos).
	byOwner := 0
	for _, i := range which {
		if leases[i].Token == 0 {
			byOwner++
		}
	}
	var ownerDone func()
	if byOwner > 0 {
		end := d.late.begin(lateKey{l.Name, l.Owner, l.Kind})
		var left atomic.Int32
		left.Store(int32(byOwner))
		ownerDone = func() {
			if left.Add(-1) == 0 {
				end()
			}
		}
	}
	results := fanout(d, context.WithoutCancel(ctx), d.timeoutFor(l.TTL), which, func(ctx context.Context, i int, nd driver.Driver) (int, error) {
		if leases[i].Token == 0 {
			defer ownerDone()
		}
		return nd.Release(ctx, *leases[i])
	})
	remaining, held := 0, 0
	var firstErr error
	// Return once the outcome is known; a hung node's release goes on in
	// the background.
collect:
	for k := 0; k < len(which) && held < d.quorum && notHeld <= n-d.quorum; k++ {
		var r result[int]
		select {
		case r = <-results:
		case <-ctx.Done():
			if firstErr == nil {
				firstErr = ctx.Err()
			}
			break collect
		}
		switch {
		case r.err == nil:
			held++
			remaining = max(remaining, r.v)
		case errors.Is(r.err, driver.ErrNotHeld):
			notHeld++
		case firstErr == nil:
			firstErr = r.err
		}
	}
	switch {
	case notHeld > n-d.quorum:
		// Too few nodes held it for the lease to be alive: another owner
		// may have been granted it since. Whatever holds were left are
		// released, but the caller must learn that its lease was gone.
		return 0, driver.ErrNotHeld
	case held > 0:
		return remaining, nil
	default:
		return 0, ctxerr.Wrap(ctx, "quorum: release", fmt.Errorf("released on no node, %d of %d did not answer: %w", n-notHeld, n, firstErr))
	}
}

// leaseOn is l as node grant g knows it.
func leaseOn(l driver.Lease, g driver.Grant) driver.Lease {
	l.Token, l.Handle = g.Token, g.Handle
	return l
}

// Renew extends every lease on every node that granted it, one Renew call
// per node in parallel, each bounded by the larger of the node timeout and
// a third of the shortest TTL. A lease is renewed when a majority of nodes
// renewed it; it is gone (ErrNotHeld, and ErrSessionLost too when a node
// reported its session gone) when more than N − majority nodes no longer
// hold it (a node that never granted it counts as one); otherwise its fate
// is unknown. After Close has begun it fails with an error wrapping
// dlock.ErrClosed.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	if !d.gate.enter() {
		return nil, errClosed
	}
	defer d.gate.exit()
	sent := time.Now()
	n := len(d.nodes)
	perNode := make([][]driver.Lease, n)
	index := make([][]int, n)
	ok := make([]int, len(ls))
	gone := make([]int, len(ls))
	session := make([]bool, len(ls))
	shortest := ls[0].TTL
	for j, l := range ls {
		shortest = min(shortest, l.TTL)
		h, _ := l.Handle.(*handle)
		if h == nil {
			for i := range perNode {
				perNode[i] = append(perNode[i], l)
				index[i] = append(index[i], j)
			}
			continue
		}
		h.mu.Lock()
		for i, p := range h.nodes {
			switch {
			case p.held:
				perNode[i] = append(perNode[i], leaseOn(l, p.grant))
				index[i] = append(index[i], j)
			case !p.unknown:
				gone[j]++
			}
		}
		h.mu.Unlock()
	}
	var which []int
	for i := range perNode {
		if len(perNode[i]) > 0 {
			which = append(which, i)
		}
	}
	timeout := max(d.timeoutFor(shortest), shortest/3)
	// Bounded by the node timeout, not by ctx: a slow node's renewal still
	// running when every lease's fate is known runs to its end, so that
	// node keeps its part of the lease.
	results := fanout(d, context.WithoutCancel(ctx), timeout, which, func(ctx context.Context, i int, nd driver.Driver) ([]error, error) {
		return nd.Renew(ctx, perNode[i])
	})
	var firstErr error
	answered := 0
	decided := func(j int) bool { return ok[j] >= d.quorum || gone[j] > n-d.quorum }
	undecided := 0
	for j := range ls {
		if !decided(j) {
			undecided++
		}
	}
	// Return once every lease's fate is known; a hung node's renewal goes
	// on in the background.
collect:
	for k := 0; k < len(which) && undecided > 0; k++ {
		var r result[[]error]
		select {
		case r = <-results:
		case <-ctx.Done():
			if firstErr == nil {
				firstErr = ctx.Err()
			}
			break collect
		}
		if r.err == nil && len(r.v) != len(perNode[r.i]) {
			r.err = fmt.Errorf("%s: renew returned %d results for %d leases", d.nodes[r.i].name, len(r.v), len(perNode[r.i]))
		}
		if r.err != nil {
			if firstErr == nil {
				firstErr = r.err
			}
			continue
		}
		answered++
		for k, e := range r.v {
			j := index[r.i][k]
			was := decided(j)
			switch {
			case e == nil:
				ok[j]++
			case errors.Is(e, driver.ErrNotHeld) || errors.Is(e, driver.ErrSessionLost):
				gone[j]++
				session[j] = session[j] || errors.Is(e, driver.ErrSessionLost)
			case firstErr == nil:
				firstErr = fmt.Errorf("%s: %w", d.nodes[r.i].name, e)
			}
			if !was && decided(j) {
				undecided--
			}
		}
	}
	errs := make([]error, len(ls))
	anyDecided := false
	for j, l := range ls {
		h, _ := l.Handle.(*handle)
		switch {
		case ok[j] >= d.quorum:
			anyDecided = true
			if h != nil {
				h.mu.Lock()
				h.expires = sent.Add(l.TTL)
				h.mu.Unlock()
			}
			d.recs.touch(l, sent.Add(l.TTL))
		case gone[j] > n-d.quorum:
			anyDecided = true
			errs[j] = fmt.Errorf("quorum: renew: the lease is gone on %d of %d nodes, a quorum is %d: %w", gone[j], n, d.quorum, driver.ErrNotHeld)
			if session[j] {
				errs[j] = fmt.Errorf("%w (%w)", errs[j], driver.ErrSessionLost)
			}
			if h != nil {
				h.finish()
			}
			d.recs.drop(l)
		default:
			errs[j] = ctxerr.Wrap(ctx, "quorum: renew", fmt.Errorf("renewed on %d of %d nodes, a quorum is %d: %v", ok[j], n, d.quorum, firstErr))
		}
	}
	if answered == 0 && !anyDecided {
		return nil, ctxerr.Wrap(ctx, "quorum: renew", fmt.Errorf("no node answered: %w", firstErr))
	}
	return errs, nil
}

// watchLoss returns a grant's Lost and Cause when enough of its granting
// nodes report loss on their own (Grant.Lost, session-bound nodes) for a
// loss of a majority to be seen: Lost closes once fewer than a majority of
// the nodes that hold the grant still hold it. The nodes that hold it are
// those of h, so a node whose grant came after the acquire returned (see
// lateAnswers) counts too: without it, losing one of the two nodes that
// had answered ended a lease that a majority still held. Otherwise both
// are nil and loss is found by Renew. The watch ends when the lease is
// released or found gone, when it lapses unrenewed, or at Close.
func (d *Driver) watchLoss(h *handle) (<-chan struct{}, func() error) {
	type watched struct {
		lost  <-chan struct{}
		cause func() error
	}
	var ws []watched
	seen := make([]bool, len(d.nodes))
	// survey counts the nodes that hold the grant and those of them whose
	// grant is not lost, and adds the Lost channels not yet watched. A node
	// that has not answered yet is not counted: a loss is signalled as soon
	// as the nodes known to hold the grant are fewer than a majority.
	var lostCause func() error // of a grant found lost by survey
	survey := func() (held, alive int) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, p := range h.nodes {
			if !p.held {
				continue
			}
			held++
			if p.grant.Lost == nil {
				alive++
				continue
			}
			select {
			case <-p.grant.Lost:
				lostCause = p.grant.Cause
				continue
			default:
			}
			alive++
			if !seen[i] {
				seen[i] = true
				ws = append(ws, watched{p.grant.Lost, p.grant.Cause})
			}
		}
		return held, alive
	}
	// lostErr is the loss of the grant on held-alive of its held nodes.
	lostErr := func(held, alive int, c func() error) error {
		var cause error = driver.ErrSessionLost
		if c != nil {
			if err := c(); err != nil {
				cause = err
			}
		}
		return fmt.Errorf("quorum: the grant is lost on %d of the %d nodes that held it, a quorum is %d: %w", held-alive, held, d.quorum, cause)
	}
	held, alive := survey()
	lctx, cancel := context.WithCancelCause(context.Background())
	if alive < d.quorum { // lost already (a node's session ended as it granted)
		cancel(lostErr(held, alive, lostCause))
		return lctx.Done(), func() error { return context.Cause(lctx) }
	}
	if mustLose := alive - d.quorum + 1; len(ws) < mustLose { // losses that leave fewer than a majority
		cancel(nil)
		return nil, nil
	}
	d.gate.spawn(func() {
		defer cancel(nil)
		timer := time.NewTimer(time.Until(h.expiry()))
		defer timer.Stop()
		for {
			cases := []reflect.SelectCase{
				{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(d.done)},
				{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.end)},
				{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)},
			}
			for _, w := range ws {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.lost)})
			}
			chosen, _, _ := reflect.Select(cases)
			switch chosen {
			case 0, 1:
				return
			case 2:
				left := time.Until(h.expiry())
				if left <= 0 {
					return // lapsed unrenewed: the dlock package has ended it
				}
				timer.Reset(left)
				continue
			}
			w := ws[chosen-3]
			ws = append(ws[:chosen-3], ws[chosen-2:]...)
			held, alive := survey()
			if alive >= d.quorum {
				continue
			}
			cancel(lostErr(held, alive, w.cause))
			return
		}
	})
	return lctx.Done(), func() error { return context.Cause(lctx) }
}

func (h *handle) expiry() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.expires
}

// records remembers, per (name, kind, owner), the token of the live lease
// the driver granted, so that a re-entry returns that token although each
// node reports its own.
type records struct {
	mu      sync.Mutex
	m       map[recKey]record
	sweepAt int
}

type recKey struct {
	name  string
	kind  driver.Kind
	owner string
}

type record struct {
	token   uint64
	nodes   []uint64 // each node's own token of the grant, 0 where none
	expires time.Time
}

func (r *records) put(req driver.AcquireRequest, token uint64, nodes []uint64, expires time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[recKey]record{}
	}
	if len(r.m) >= r.sweepAt {
		now := time.Now()
		for k, v := range r.m {
			if now.After(v.expires) {
				delete(r.m, k)
			}
		}
		r.sweepAt = max(64, 2*len(r.m))
	}
	r.m[recKey{req.Name, req.Kind, req.Owner}] = record{token: token, nodes: nodes, expires: expires}
}

// match returns the recorded token of req's lease when the re-entered
// nodes' tokens (0 where a node did not re-enter) are that lease's.
func (r *records) match(req driver.AcquireRequest, tokens []uint64) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.m[recKey{req.Name, req.Kind, req.Owner}]
	if !ok || time.Now().After(rec.expires) || len(rec.nodes) != len(tokens) {
		return 0, false
	}
	same := 0
	for i, t := range tokens {
		switch {
		case t == 0 || rec.nodes[i] == 0:
		case t != rec.nodes[i]:
			return 0, false
		default:
			same++
		}
	}
	return rec.token, same > 0
}

func (r *records) touch(l driver.Lease, expires time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := recKey{l.Name, l.Kind, l.Owner}
	if rec, ok := r.m[k]; ok && rec.token == l.Token && expires.After(rec.expires) {
		rec.expires = expires
		r.m[k] = rec
	}
}

func (r *records) drop(l driver.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := recKey{l.Name, l.Kind, l.Owner}
	if rec, ok := r.m[k]; ok && (rec.token == l.Token || l.Token == 0) {
		delete(r.m, k)
	}
}
