package quorum

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/gather"
)

// Subscribe subscribes to releases of name on every node that is a
// driver.Notifier; the subscription fires when any of them notifies (a
// release shows on each node as it reaches it, so the first copy wakes the
// waiter; a waiter that then finds a majority still held waits for the next
// copy or its retry hint). The nodes are subscribed at once, each within
// the node timeout; Subscribe returns when all have answered, or when a
// quorum has subscribed and the others have had as long again as that took
// (a node that does not answer costs a waiting Lock nothing then). A node's
// subscription that comes later is closed. It fails, and the dlock package
// polls, when no node can notify.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	if !d.gate.enter() {
		return nil, errClosed
	}
	defer d.gate.exit()
	var which []int
	for i, n := range d.nodes {
		if _, ok := n.d.(driver.Notifier); ok {
			which = append(which, i)
		}
	}
	if len(which) == 0 {
		return nil, ctxerr.Wrap(ctx, "quorum: subscribe", errors.New("no node notifies releases"))
	}
	results := fanout(d, ctx, d.timeoutFor(0), which, func(ctx context.Context, _ int, nd driver.Driver) (driver.Subscription, error) {
		return nd.(driver.Notifier).Subscribe(ctx, name)
	})
	s := &sub{c: make(chan struct{}, 1), stop: make(chan struct{})}
	var firstErr error
	answers := gather.Quorum(results, len(which), d.quorum, func(r result[driver.Subscription]) bool { return r.err == nil })
	for _, r := range answers {
		if r.err != nil {
			if firstErr == nil {
				firstErr = r.err
			}
			continue
		}
		s.subs = append(s.subs, r.v)
	}
	if late := len(which) - len(answers); late > 0 {
		d.gate.spawn(func() {
			for range late {
				if r := <-results; r.err == nil {
					_ = r.v.Close()
				}
			}
		})
	}
	if len(s.subs) == 0 {
		return nil, ctxerr.Wrap(ctx, "quorum: subscribe", firstErr)
	}
	for _, ns := range s.subs {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				select {
				case <-s.stop:
					return
				case _, ok := <-ns.C():
					if !ok {
						return
					}
					select {
					case s.c <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return s, nil
}

// sub merges the nodes' subscriptions.
type sub struct {
	c    chan struct{}
	subs []driver.Subscription
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
	err  error
}

func (s *sub) C() <-chan struct{} { return s.c }

func (s *sub) Close() error {
	s.once.Do(func() {
		close(s.stop)
		s.wg.Wait()
		for _, ns := range s.subs {
			if err := ns.Close(); err != nil && s.err == nil {
				s.err = err
			}
		}
	})
	return s.err
}

// RaiseFence raises the counter of name's kind k to at least atLeast on
// every node, and succeeds only when every node did (so a quorum driver can
// be a node of another). A majority is not enough: a node held by another
// owner since before the raise proves nothing, since that owner can
// complete its majority with it and an unraised node the caller held, once
// the caller releases there, with a token below atLeast (see
// TestNestedRaiseFenceHeldNodes). A node that is down or slow therefore
// fails the raise.
func (d *Driver) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	if !d.gate.enter() {
		return errClosed
	}
	defer d.gate.exit()
	results := fanout(d, ctx, d.timeoutFor(0), nil, func(ctx context.Context, _ int, nd driver.Driver) (struct{}, error) {
		return struct{}{}, nd.(driver.FenceRaiser).RaiseFence(ctx, name, k, atLeast)
	})
	okCount := 0
	var firstErr error
	for range d.nodes {
		if r := <-results; r.err != nil {
			if firstErr == nil {
				firstErr = r.err
			}
		} else {
			okCount++
		}
	}
	if okCount < len(d.nodes) {
		return ctxerr.Wrap(ctx, "quorum: raise fence", fmt.Errorf("raised on %d of %d nodes, every node is needed: %w", okCount, len(d.nodes), firstErr))
	}
	return nil
}

// SupportsKind reports mutexes only. Read/write locks and semaphores have
// several holders at once, whose grants on independent nodes are not
// ordered: two readers granted concurrently can get the same token from
// the nodes' separate counters, or a reader a token below that of a reader
// that ended before it was granted, against driver/kinds.go's token rules.
// Keeping them would need a consensus on the counter, which the nodes do
// not share. The dlock package refuses those kinds with ErrUnsupported.
func (d *Driver) SupportsKind(k driver.Kind) bool { return k == driver.Exclusive }

// CheckName applies every node's name rules (driver.NameChecker).
func (d *Driver) CheckName(name string) error {
	for _, n := range d.nodes {
		if nc, ok := n.d.(driver.NameChecker); ok {
			if err := nc.CheckName(name); err != nil {
				return fmt.Errorf("%s: %w", n.name, err)
			}
		}
	}
	return nil
}

// Limits are the strictest of the nodes': the longest MinTTL, and a
// granularity every node's divides.
func (d *Driver) Limits() driver.Limits {
	var l driver.Limits
	for _, n := range d.nodes {
		nl, ok := n.d.(driver.Limiter)
		if !ok {
			continue
		}
		x := nl.Limits()
		l.MinTTL = max(l.MinTTL, x.MinTTL)
		if x.TTLGranularity > 0 {
			if l.TTLGranularity == 0 {
				l.TTLGranularity = x.TTLGranularity
			} else {
				l.TTLGranularity = l.TTLGranularity / gcd(l.TTLGranularity, x.TTLGranularity) * x.TTLGranularity
			}
		}
	}
	return l
}

func gcd(a, b time.Duration) time.Duration {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Inspect lists the locks whose names start with prefix as a majority of
// nodes sees them, one LockInfo per name and kind: Owner is the owner
// holding the lock on a majority of nodes (empty if none does), Count its
// largest hold count there, ExpiresIn the time until fewer than a majority
// hold it (negative when a node cannot tell); Token is the largest token any
// node reports (the lease's own, since a grant's token is the largest of its
// nodes'); Readers and Holders are the counts a majority of nodes reach,
// Permits the largest; Waiters the largest a node reports (-1 when none
// can tell). It fails if fewer than a majority of nodes answer, and wraps
// driver.ErrUnsupported when fewer than a majority can list locks.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if !d.gate.enter() {
		return nil, errClosed
	}
	defer d.gate.exit()
	var which []int
	for i, n := range d.nodes {
		if _, ok := n.d.(driver.Inspector); ok {
			which = append(which, i)
		}
	}
	if len(which) < d.quorum {
		return nil, fmt.Errorf("quorum: inspect: only %d of %d nodes can list locks, a quorum is %d: %w", len(which), len(d.nodes), d.quorum, driver.ErrUnsupported)
	}
	results := fanout(d, ctx, 10*time.Second, which, func(ctx context.Context, _ int, nd driver.Driver) ([]driver.LockInfo, error) {
		return nd.(driver.Inspector).Inspect(ctx, prefix)
	})
	type key struct {
		name string
		kind driver.Kind
	}
	byKey := map[key][]driver.LockInfo{}
	answered := 0
	var firstErr error
	for range which {
		r := <-results
		if r.err != nil {
			if firstErr == nil {
				firstErr = r.err
			}
			continue
		}
		answered++
		for _, in := range r.v {
			k := key{in.Name, in.Kind}
			byKey[k] = append(byKey[k], in)
		}
	}
	if answered < d.quorum {
		return nil, ctxerr.Wrap(ctx, "quorum: inspect", fmt.Errorf("only %d of %d nodes answered, a quorum is %d: %w", answered, len(d.nodes), d.quorum, firstErr))
	}
	out := make([]driver.LockInfo, 0, len(byKey))
	for k, ins := range byKey {
		info := driver.LockInfo{Name: k.name, Kind: k.kind, Waiters: -1}
		owners := map[string][]driver.LockInfo{}
		var readers, holders []int
		for _, in := range ins {
			info.Token = max(info.Token, in.Token)
			info.Waiters = max(info.Waiters, in.Waiters)
			info.Permits = max(info.Permits, in.Permits)
			readers = append(readers, in.Readers)
			holders = append(holders, in.Holders)
			if in.Owner != "" && in.Count > 0 {
				owners[in.Owner] = append(owners[in.Owner], in)
			}
		}
		info.Readers = d.majorityOf(readers)
		info.Holders = d.majorityOf(holders)
		for owner, held := range owners {
			if len(held) < d.quorum {
				continue
			}
			info.Owner = owner
			left := make([]time.Duration, 0, len(held))
			for _, in := range held {
				info.Count = max(info.Count, in.Count)
				left = append(left, in.ExpiresIn)
			}
			slices.Sort(left)
			if left[0] < 0 {
				info.ExpiresIn = -1
			} else {
				info.ExpiresIn = left[len(left)-d.quorum]
			}
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out, nil
}

// majorityOf returns the largest value that a majority of nodes reach
// (nodes that did not list the lock count as 0).
func (d *Driver) majorityOf(vs []int) int {
	if len(vs) < d.quorum {
		return 0
	}
	slices.Sort(vs)
	return vs[len(vs)-d.quorum]
}
