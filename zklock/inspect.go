package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
)

var _ driver.Inspector = (*Driver)(nil)

// Inspect implements driver.Inspector: it walks the nodes under the root
// whose lock names start with prefix. For each lock with a holder it reports
// the holder's owner (its node's data; kazoo's identifier for a kazoo
// holder, or "zk-session:<session id in hex>" for a holder whose node holds
// no data, as kazoo's and Curator's do by default), its token (czxid), the number of waiters, and ExpiresIn -1 (the
// lock lives as long as the holder's session). Count is the holder's hold
// count when this driver holds it, else 1. It costs one request per node
// visited plus one per lock.
//
// A lock kept only by the lock-delay guard of a holder that went without a
// release (see delay.go) is listed as not takeable: Owner LockDelayOwner,
// Count 0, Token 0, ExpiresIn the time left before the guard lets a grant
// through, and Waiters the requests queued behind it; likewise a read/write
// lock or semaphore with no live holder but a lost holder's guard (a
// semaphore counts such guards in Holders). To measure that time on the
// leader's clock, Inspect does what the next contender would: it arms a
// guard whose loss nobody has seen yet (the delay runs from then), reads
// the clock with a write to the guard, and deletes a guard whose delay has
// run out (the lock is then free). Without write access to the guard
// (ErrNoAuth) it reports ExpiresIn -1 (unknown).
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	l, err := d.anyLink(ctx)
	if err != nil {
		return nil, fmt.Errorf("zklock: inspect: %w", err)
	}
	conn := l.conn
	var out []driver.LockInfo
	var walk func(rel string) error
	walk = func(rel string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		path := d.join(rel)
		children, err := do(ctx, func() ([]string, error) {
			c, _, err := conn.Children(path)
			return c, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return err
		}
		if q := queue(children); (len(q) > 0 || slices.Contains(children, guardName)) && rel != "" && strings.HasPrefix(unescapeName(rel), prefix) {
			if info, ok, err := d.inspectQueue(ctx, conn, rel, path, q); err != nil {
				return err
			} else if ok {
				out = append(out, info)
			}
		}
		if rel != "" && strings.HasPrefix(unescapeName(rel), prefix) {
			for _, k := range []struct {
				node string
				kind driver.Kind
			}{{rwNode, driver.Write}, {semNode, driver.Permit}} {
				if !slices.Contains(children, k.node) {
					continue
				}
				if info, ok, err := d.inspectKind(ctx, conn, unescapeName(rel), path+"/"+k.node, k.kind); err != nil {
					return err
				} else if ok {
					out = append(out, info)
				}
			}
		}
		sort.Strings(children)
		for _, c := range children {
			if contender.MatchString(c) || c == guardName || c == rwNode || c == semNode {
				continue
			}
			sub := c
			if rel != "" {
				sub = rel + "/" + c
			} else if d.root == "/" && c == "zookeeper" {
				continue // ZooKeeper's own nodes
			}
			// Descend only where names can still start with the prefix:
			// every name below sub starts with its name and a '/'.
			if dsub := unescapeName(sub); strings.HasPrefix(dsub, prefix) || strings.HasPrefix(prefix, dsub+"/") {
				if err := walk(sub); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return nil, fmt.Errorf("zklock: inspect: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out, nil
}

func (d *Driver) join(rel string) string {
	switch {
	case rel == "":
		return d.root
	case d.root == "/":
		return "/" + rel
	default:
		return d.root + "/" + rel
	}
}

// inspectQueue describes the lock whose queue q lives at path.
func (d *Driver) inspectQueue(ctx context.Context, conn *zk.Conn, rel, path string, q []string) (driver.LockInfo, bool, error) {
	left, err := d.inspectGuard(ctx, conn, path+"/"+guardName, func(holder string) bool { return len(q) > 0 && holder == q[0] })
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	if left != 0 {
		// The head of the queue (if any) waits for the guard.
		return driver.LockInfo{Name: unescapeName(rel), Owner: LockDelayOwner, ExpiresIn: left, Waiters: len(q)}, true, nil
	}
	type node struct {
		data []byte
		st   *zk.Stat
	}
	for _, head := range q {
		n, err := do(ctx, func() (node, error) {
			data, st, err := conn.Get(path + "/" + head)
			return node{data, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			continue // released meanwhile: the next one holds
		}
		if err != nil {
			return driver.LockInfo{}, false, err
		}
		name := unescapeName(rel)
		owner := string(n.data)
		if owner == "" {
			// A client that stores no identifier (kazoo's and Curator's
			// defaults): name its session instead, so that the lock does
			// not look free.
			owner = fmt.Sprintf("zk-session:%x", n.st.EphemeralOwner)
		}
		info := driver.LockInfo{Name: name, Owner: owner, Token: uint64(n.st.Czxid), Count: 1, ExpiresIn: -1, Waiters: len(q) - 1}
		info.Count = d.holds.Count(name, info.Owner, func(h *handle) bool { return h.path == path+"/"+head })
		return info, true, nil
	}
	return driver.LockInfo{}, false, nil
}

// unescapeName reverses escapeName, leaving a '%' that starts no escape as
// it is (a node another client named).
func unescapeName(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// LockDelayOwner is the Owner that Inspect reports for a lock kept only by
// the lock-delay guard of a holder that went without a release.
const LockDelayOwner = "lock-delay"

// inspectGuard looks at the lock-delay guard gp (see checkGuardAt): it
// returns 0 when there is none or it does not stand in the way (its holder
// is live), else how long it keeps the lock (-1: unknown, no write access).
func (d *Driver) inspectGuard(ctx context.Context, conn *zk.Conn, gp string, live func(holder string) bool) (time.Duration, error) {
	for range 3 {
		left, err := d.checkGuardAt(ctx, conn, gp, live)
		switch {
		case errors.Is(err, zk.ErrNoAuth):
			return -1, nil
		case err != nil:
			return 0, fmt.Errorf("lock-delay guard %s: %w", gp, err)
		case left < 0:
			return 0, nil
		case left == time.Millisecond:
			continue // armed by someone else meanwhile: look again
		}
		return left, nil
	}
	return time.Millisecond, nil
}

// lostGuards counts the lock-delay guards among children of dir whose names
// start with prefix and whose holder is not live, and returns the longest
// time one of them keeps the lock (see inspectGuard).
func (d *Driver) lostGuards(ctx context.Context, conn *zk.Conn, dir string, children []string, prefix string, live func(holder string) bool) (n int, longest time.Duration, err error) {
	for _, c := range children {
		if !strings.HasPrefix(c, prefix) {
			continue
		}
		left, err := d.inspectGuard(ctx, conn, dir+"/"+c, live)
		if err != nil {
			return 0, 0, err
		}
		if left != 0 {
			n++
			if left < 0 || longest >= 0 && left > longest {
				longest = left
			}
		}
	}
	return n, longest, nil
}
