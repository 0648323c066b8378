package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// renewParallel bounds the requests one Renew has in flight.
const renewParallel = 64

// renewMultiMin is the batch size from which Renew checks nodes with multi
// requests rather than one Exists each; renewMultiOps is how many check
// operations one multi carries (well under ZooKeeper's 1MB packet limit).
const (
	renewMultiMin = 64
	renewMultiOps = 1000
)

// Renew implements driver.Driver. Each session is kept alive by the
// requests the server answers (see watch); Renew proves it alive and each
// node still in place, with requests sent after Renew was called. A small
// batch sends one Exists per node, pipelined on the connection (one round
// trip of latency); a large one sends multi requests of up to 1000 check
// operations each, all at once, and falls back to Exists for a multi that
// fails (some node is gone).
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	r := &renewal{
		ctx:     ctx,
		errs:    make([]error, len(ls)),
		hds:     make([]*handle, len(ls)),
		checked: make([]bool, len(ls)),
		sem:     make(chan struct{}, renewParallel),
	}
	live := r.admit(ls)
	if len(live) < renewMultiMin {
		for _, i := range live {
			if !r.run(func() { r.exists(i) }) {
				break
			}
		}
	} else {
		for _, chunk := range r.chunks(live) {
			if !r.run(func() { r.multi(chunk) }) {
				break
			}
		}
	}
	r.wg.Wait()
	for _, i := range live {
		if !r.checked[i] { // not sent before ctx ended
			r.unknownFate(i, ctx.Err())
		}
	}
	if len(live) > 0 && r.unknown == len(ls) {
		return nil, ctxerr.Wrap(ctx, "zklock: renew", r.firstErr)
	}
	return r.errs, nil
}

// renewal is one Renew call's state.
type renewal struct {
	ctx  context.Context
	hds  []*handle // of the leases admitted; nil for the others
	errs []error   // the result per lease
	sem  chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex // guards checked, unknown, firstErr and errs once requests run
	checked  []bool     // a request about the lease was answered (or failed)
	unknown  int        // leases whose fate is unknown
	firstErr error
}

// admit sorts out the leases that need no request (a foreign handle, a lost
// session, another TTL) and returns the indexes of the others.
func (r *renewal) admit(ls []driver.Lease) (live []int) {
	for i, l := range ls {
		hd, ok := l.Handle.(*handle)
		switch {
		case !ok || hd == nil:
			r.errs[i] = fmt.Errorf("zklock: renew: foreign handle %T: %w", l.Handle, driver.ErrNotHeld)
		case hd.sess.Lost():
			r.errs[i] = fmt.Errorf("%w: %w", driver.ErrNotHeld, hd.sess.Cause())
		case l.TTL != 0 && msTimeout(l.TTL) != hd.sess.ttl:
			// Extend to another TTL: the node lives as long as its
			// session, whose timeout cannot change.
			r.errs[i] = fmt.Errorf("zklock: renew %q with TTL %v: its TTL is its ZooKeeper session's timeout %v, which cannot change: %w", l.Name, l.TTL, hd.sess.ttl, driver.ErrUnsupported)
		default:
			r.hds[i] = hd
			live = append(live, i)
		}
	}
	return live
}

// run runs f on a goroutine once fewer than renewParallel run, or reports
// false when ctx ends first.
func (r *renewal) run(f func()) bool {
	select {
	case r.sem <- struct{}{}:
	case <-r.ctx.Done():
		return false
	}
	r.wg.Go(func() {
		defer func() { <-r.sem }()
		f()
	})
	return true
}

// unknownFate records that lease i's fate is unknown after err. The caller
// holds r.mu, or no request runs any more.
func (r *renewal) unknownFate(i int, err error) {
	r.errs[i] = fmt.Errorf("zklock: renew: %w", err)
	r.unknown++
	r.firstErr = err
}

// exists checks lease i's node with one Exists.
func (r *renewal) exists(i int) {
	hd := r.hds[i]
	sent := time.Now()
	st, err := do(r.ctx, func() (*zk.Stat, error) {
		ok, st, err := hd.sess.l.conn.Exists(hd.path)
		if err == nil && !ok {
			st = nil
		}
		return st, err
	})
	if err == nil && hd.sess.l.conn.SessionID() == hd.sess.id {
		hd.sess.Refresh(sent)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checked[i] = true
	switch {
	case err != nil:
		r.unknownFate(i, err)
	case st == nil || st.Czxid != hd.czxid:
		r.errs[i] = fmt.Errorf("zklock: node %s is gone: %w", hd.path, driver.ErrNotHeld)
	case st.EphemeralOwner != hd.sess.id:
		r.errs[i] = fmt.Errorf("zklock: node %s outlived its session: %w", hd.path, driver.ErrNotHeld)
	}
}

// chunks groups the live leases by session (one multi carries the checks
// of one session's nodes) in chunks of at most renewMultiOps.
func (r *renewal) chunks(live []int) [][]int {
	var groups [][]int
	bySess := map[*session]int{}
	for _, i := range live {
		g, ok := bySess[r.hds[i].sess]
		if !ok {
			g = len(groups)
			bySess[r.hds[i].sess] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	var chunks [][]int
	for _, g := range groups {
		for start := 0; start < len(g); start += renewMultiOps {
			chunks = append(chunks, g[start:min(start+renewMultiOps, len(g))])
		}
	}
	return chunks
}

// multi checks the nodes of chunk, all of one session, with one multi
// request; when some node is gone it finds which with exists.
func (r *renewal) multi(chunk []int) {
	sess := r.hds[chunk[0]].sess
	conn := sess.l.conn
	ops := make([]any, len(chunk))
	for j, i := range chunk {
		ops[j] = &zk.CheckVersionRequest{Path: r.hds[i].path, Version: -1}
	}
	sent := time.Now()
	_, err := do(r.ctx, func() ([]zk.MultiResponse, error) { return conn.Multi(ops...) })
	switch {
	case err == nil:
		if conn.SessionID() == sess.id {
			sess.Refresh(sent)
		}
		// Every node exists: paths are unique, so they are ours.
		r.mu.Lock()
		for _, i := range chunk {
			r.checked[i] = true
		}
		r.mu.Unlock()
	case errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion):
		for _, i := range chunk { // some node is gone: find which
			r.exists(i)
		}
	default:
		r.mu.Lock()
		for _, i := range chunk {
			r.checked[i] = true
			r.unknownFate(i, err)
		}
		r.mu.Unlock()
	}
}
