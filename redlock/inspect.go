package redlock

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/redisscript"
)

// Inspect lists the locks whose names start with prefix as a quorum sees
// them: Owner is the owner holding the lock on a quorum of nodes (empty if
// none does), Token the highest counter on any node, ExpiresIn the time
// until fewer than a quorum hold it. Waiters is -1. A name's read/write lock
// is listed apart (Kind driver.Write), after its mutex: Owner is the writer
// holding a quorum, or Readers, Count, Waiters (waiting writers) and
// ExpiresIn are what a quorum of nodes sees at least (the quorum-th
// largest value among the nodes). A name held on a quorum
// by keys dlock did not write is shown with Owner "?"
// (redisscript.ForeignOwner), Token 0, Count 1 and ExpiresIn the time until
// fewer than a quorum of those keys are left, negative when they have no
// expiry. It fails if fewer than a quorum of nodes answer.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if !d.gate.Enter() {
		return nil, errClosed
	}
	defer d.gate.Exit()
	results := fanout(d, ctx, 10*time.Second, func(ctx context.Context, n *node) ([]redisscript.NodeLock, error) {
		return redisscript.Inspect(ctx, n.client, d.prefix, prefix)
	})
	type agg struct {
		info   driver.LockInfo
		owners map[string][]redisscript.NodeLock
		all    []redisscript.NodeLock
	}
	type nameKind struct {
		name string
		kind driver.Kind
	}
	byName := map[nameKind]*agg{}
	answered := 0
	var firstErr error
	for range d.nodes {
		r := <-results
		if r.err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
			continue
		}
		answered++
		for _, l := range r.v {
			a := byName[nameKind{l.Name, l.Kind}]
			if a == nil {
				a = &agg{info: driver.LockInfo{Name: l.Name, Waiters: -1, Kind: l.Kind}, owners: map[string][]redisscript.NodeLock{}}
				byName[nameKind{l.Name, l.Kind}] = a
			}
			a.all = append(a.all, l)
			a.info.Token = max(a.info.Token, l.Fence)
			switch {
			case l.Foreign:
				a.owners[foreignHolder] = append(a.owners[foreignHolder], l)
			case l.Owner != "":
				a.owners[l.Owner] = append(a.owners[l.Owner], l)
			}
		}
	}
	if answered < d.quorum {
		return nil, ctxerr.Wrap(ctx, "redlock: inspect", fmt.Errorf("only %d of %d nodes answered: %w", answered, len(d.nodes), firstErr))
	}
	out := make([]driver.LockInfo, 0, len(byName))
	for _, a := range byName {
		for owner, ls := range a.owners {
			if len(ls) < d.quorum {
				continue
			}
			a.info.Owner = owner
			// A foreign key's negative PTTL means no expiry: it outlasts
			// every other.
			left := func(l redisscript.NodeLock) time.Duration {
				if l.PTTL < 0 {
					return never
				}
				return l.PTTL
			}
			sort.Slice(ls, func(i, j int) bool { return left(ls[i]) > left(ls[j]) })
			a.info.ExpiresIn = ls[d.quorum-1].PTTL
			for _, l := range ls {
				a.info.Count = max(a.info.Count, l.Count)
			}
			if owner == foreignHolder {
				a.info.Owner, a.info.Token = redisscript.ForeignOwner, 0
			}
		}
		if a.info.Kind != driver.Exclusive {
			// What a quorum of nodes sees at least: the quorum-th largest
			// value among the nodes (a node without the lock counts 0).
			atQuorum := func(f func(redisscript.NodeLock) int) int {
				vs := make([]int, 0, len(a.all))
				for _, l := range a.all {
					vs = append(vs, f(l))
				}
				sort.Sort(sort.Reverse(sort.IntSlice(vs)))
				if len(vs) < d.quorum {
					return 0
				}
				return vs[d.quorum-1]
			}
			a.info.Readers = atQuorum(func(l redisscript.NodeLock) int { return l.Readers })
			a.info.Waiters = atQuorum(func(l redisscript.NodeLock) int { return l.Waiters })
			if a.info.Owner == "" {
				a.info.Count = atQuorum(func(l redisscript.NodeLock) int { return l.Count })
				a.info.ExpiresIn = time.Duration(atQuorum(func(l redisscript.NodeLock) int { return int(l.PTTL) }))
			}
		}
		out = append(out, a.info)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out, nil
}
