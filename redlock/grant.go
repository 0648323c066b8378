package redlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

// Grant-in-release (docs/protocol.md, "Redlock"): a waiting Lock asks every
// node, with each refused attempt, to be granted the lock by the release
// that frees it; the release script then sets the lock to the waiter (new
// token, the waiter's TTL) and publishes the grant on the waiter's
// driver's grant channel, so a hand-off is a release plus one message per
// node, not a wake-up plus another round of acquires. The waiter holds
// the lock once a quorum of nodes granted it.
//
// Why a grant message can be trusted, and from when its lease counts: a
// waiter's refused attempt on node i, sent at S and executed at E, reports
// the node's fencing counter C as it was at E. A grant carries the token
// the release made, counter + 1; tokens on a node only grow, so a grant
// whose token is above C was made after E, and so after S: its lease on
// the node (PX TTL from the grant) lasts at least until S + TTL. The
// waiter keeps, per node, the latest send time of a refused attempt and
// the largest counter reported (raised further by every token the node
// gave it in an attempt's reply, so that the message of a grant the
// waiter adopted and then undid never counts again). A grant counts if
// its token is above that counter; the lease's validity is measured from
// the earliest such send time over the quorum that granted, minus the
// dlock package's drift as for any grant. When that leaves less than two
// thirds of the TTL, the waiter does not count the grants but tries again
// instead, which adopts them with a fresh lease.
//
// A dead waiter is not granted: the release publishes the grant before it
// makes it and makes it only when the message reached a subscriber (its
// driver's connection is up); a queue entry that is not renewed is
// dropped as before. A waiter that gets grants from fewer than a quorum
// of nodes (the nodes' queues disagreed) waits for the others for at most
// the node timeout, then tries again: the attempt adopts the grants and,
// short of a quorum, gives them back (undo) like any minority. Grants for
// a waiter that has gone (its Lock returned) are released by token, unless
// its owner holds the lock through this driver (a quorum's late node).

// grantState is one waiting Lock's grants by node (see above).
type grantState struct {
	mu    sync.Mutex
	nodes []grantNode
}

type grantNode struct {
	sent  time.Time // latest send time of a refused attempt (zero: none answered)
	floor uint64    // a grant counts if its token is above this
	token uint64    // largest token of a grant message, 0 for none
	// from is the grant the release that made token's grant released
	// (see counted).
	from released
}

// released is the grant a release freed: its owner and token.
type released struct {
	owner string
	token uint64
}

func newGrantState(n int) *grantState { return &grantState{nodes: make([]grantNode, n)} }

// refused records a refused attempt on node i sent at sent, which saw the
// node's fencing counter at counter.
func (g *grantState) refused(i int, sent time.Time, counter uint64) {
	g.mu.Lock()
	n := &g.nodes[i]
	if sent.After(n.sent) {
		n.sent = sent
	}
	n.floor = max(n.floor, counter)
	g.mu.Unlock()
}

// granted records that an attempt's reply on node i granted (or adopted)
// token: a grant message with that token or a smaller one is not a grant
// the waiter still has after this attempt.
func (g *grantState) granted(i int, token uint64) {
	g.mu.Lock()
	n := &g.nodes[i]
	n.floor = max(n.floor, token)
	g.mu.Unlock()
}

// offer records a grant message of node i: token, made by the release of
// from.
func (g *grantState) offer(i int, token uint64, from released) {
	g.mu.Lock()
	n := &g.nodes[i]
	if token > n.token {
		n.token, n.from = token, from
	}
	g.mu.Unlock()
}

// nodeGrant is a grant a waiter counts: node, token, and the send time its
// lease is measured from.
type nodeGrant struct {
	i     int
	token uint64
	sent  time.Time
}

// counted returns the largest set of grants that count together, and
// how many grant messages came in all (counted or not). A grant counts
// when its token is above its node's floor (see grantState); grants count
// together when the releases that made them freed one grant (same owner
// and token): that grant's token had been written back to those nodes
// (a grant's value carries its final token only after the write-back),
// so each new token is above it, and it was above every token handed out
// before it. Grants made by the releases of different holders could come
// from before one of them wrote its token back, and are adopted by an
// attempt instead, which gives them new tokens.
func (g *grantState) counted() (got []nodeGrant, messages int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var best released
	bestN := 0
	for i := range g.nodes {
		n := &g.nodes[i]
		if n.token != 0 {
			messages++
		}
		if !n.counts() {
			continue
		}
		c := 0
		for j := range g.nodes {
			if g.nodes[j].counts() && sameRelease(g.nodes[j].from, n.from) {
				c++
			}
		}
		if c > bestN {
			best, bestN = n.from, c
		}
	}
	for i := range g.nodes {
		if n := &g.nodes[i]; bestN > 0 && n.counts() && sameRelease(n.from, best) {
			got = append(got, nodeGrant{i: i, token: n.token, sent: n.sent})
		}
	}
	return got, messages
}

// counts reports whether n's grant message counts on its own: its token
// is above the counter a refused attempt on the node reported (and every
// token an attempt got there since).
func (n *grantNode) counts() bool { return !n.sent.IsZero() && n.token > n.floor }

// sameRelease reports whether two grants were made by releasing one grant.
func sameRelease(a, b released) bool { return a == b }

// tokens returns every grant message's token by node (0: none), for a
// waiter that gives up and releases them.
func (g *grantState) tokens() []uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := make([]uint64, len(g.nodes))
	for i, n := range g.nodes {
		if n.token > n.floor {
			ts[i] = n.token
		}
	}
	return ts
}

// subscribeGrants subscribes the driver's grant channel on every node
// that is not yet, trying a node at most once a second (best effort: a node
// without it wakes the waiter instead of granting, since its publish
// reaches nobody). While fewer than a quorum of nodes are subscribed it
// waits for the subscriptions (all at once, each within the node
// timeout); otherwise the missing nodes are subscribed in the background,
// so that a node that does not answer costs the waiter nothing.
func (d *Driver) subscribeGrants(ctx context.Context) {
	d.grantMu.Lock()
	hubs := make([]*redisscript.Hub, len(d.nodes))
	have, try := 0, 0
	for i, n := range d.nodes {
		if d.grantSubs[i] {
			have++
			continue
		}
		if time.Since(d.grantTried[i]) < time.Second {
			continue
		}
		d.grantTried[i] = time.Now()
		hubs[i] = n.hub
		try++
	}
	if try == 0 {
		d.grantMu.Unlock()
		return
	}
	// mark records the subscriptions made. grantMu must be held.
	mark := func(subs []*redisscript.Sub) {
		for i, s := range subs {
			if s != nil {
				d.grantSubs[i] = true
			}
		}
	}
	if have < d.quorum {
		defer d.grantMu.Unlock()
		subs, _ := redisscript.SubscribeEach(ctx, hubs, d.timeoutFor(0), try, d.grantCh, "", d.grantSig)
		mark(subs)
		return
	}
	d.grantMu.Unlock()
	// Without grantMu held meanwhile, so that other waiters do not queue
	// behind a node that does not answer; grantTried keeps them from
	// trying the same nodes for a second.
	d.gate.Add(1)
	go func() {
		defer d.gate.Done()
		subs, _ := redisscript.SubscribeEach(context.WithoutCancel(ctx), hubs, d.timeoutFor(0), try, d.grantCh, "", d.grantSig)
		d.grantMu.Lock()
		mark(subs)
		d.grantMu.Unlock()
	}()
}

// grantMessage handles a grant message "token\nowner\nreleased
// token\nreleasing owner\nrelease channel" from node i: the waiter it names gets it, or, if it has no waiting Lock
// here and does not hold the lock through this driver, the grant is
// released (by token, so that nothing newer is touched).
func (d *Driver) grantMessage(i int, payload string) {
	m, ok := redisscript.ParseGrantMessage(payload)
	if !ok {
		return
	}
	token, owner, from, channel := m.Token, m.Owner, released{owner: m.From, token: m.FromTok}, m.Channel
	ls := &d.listeners
	ls.mu.Lock()
	if l := ls.m[channel]; l != nil {
		if w := l.owners[owner]; w != nil && w.grants != nil {
			w.grants.offer(i, token, from)
			w.wake()
			ls.mu.Unlock()
			return
		}
	}
	ls.mu.Unlock()
	k, ok := redisscript.KeysOfChannel(channel)
	if !ok || d.grants.Has(k.Lock, owner) {
		return
	}
	d.releaseGrant(k, owner, i, token)
}

// unusedGrant is a grant a waiter was sent and did not use.
type unusedGrant struct {
	k     redisscript.Keys
	owner string
	node  int
	token uint64
}

// releaseGrant releases owner's grant token of k on node i (handing the
// lock on to the next waiter): in the background, or, once Close has
// begun, at once (Close closes the connections only after the pub/sub
// loops that call it have stopped).
func (d *Driver) releaseGrant(k redisscript.Keys, owner string, i int, token uint64) {
	if !d.gate.Enter() {
		ctx, cancel := context.WithTimeout(context.Background(), MaxNodeTimeout)
		defer cancel()
		_, _, _ = releaseGranting(ctx, d.nodes[i].client, k, owner, token)
		return
	}
	d.gate.Add(1)
	d.gate.Exit()
	d.spawn(func() {
		defer d.gate.Done()
		ctx, cancel := context.WithTimeout(context.Background(), MaxNodeTimeout)
		defer cancel()
		_, _, _ = releaseGranting(ctx, d.nodes[i].client, k, owner, token)
	})
}

// giveBack releases the grants a waiter that gives up was sent and did
// not use.
func (d *Driver) giveBack(k redisscript.Keys, owner string, g *grantState) {
	for i, t := range g.tokens() {
		if t != 0 {
			d.releaseGrant(k, owner, i, t)
		}
	}
}

// minGrantValidity is the share of the TTL a quorum of grant messages must
// leave (measured from the send time their leases count from) for the
// waiter to hold the lock on them: less, and it tries again instead.
const minGrantValidity = 3 // thirds: the lease is not older than TTL/3

// takeGrants turns a quorum of grant messages into the waiter's grant, if
// they leave enough validity: the token is the largest, written back to
// the granting nodes that have a smaller one until a quorum has it (as an
// acquire's), and the lease counts from the earliest send time of the
// grants. ok is false when the waiter must try again instead (too little
// validity, or the write-back failed, whose grants it then gives back).
func (d *Driver) takeGrants(ctx context.Context, ops *lockOps, got []nodeGrant) (g driver.Grant, ok bool, err error) {
	if !d.gate.Enter() {
		return driver.Grant{}, false, errClosed
	}
	defer d.gate.Exit()
	sent := got[0].sent
	var token uint64
	for _, x := range got {
		if x.sent.Before(sent) {
			sent = x.sent
		}
		token = max(token, x.token)
	}
	if time.Since(sent) > ops.req.TTL/minGrantValidity {
		return driver.Grant{}, false, nil
	}
	timeout := d.timeoutFor(ops.req.TTL)
	results := make([]result[redisscript.AcquireResult], len(got))
	for j, x := range got {
		results[j] = result[redisscript.AcquireResult]{i: x.i, v: redisscript.AcquireResult{Granted: true, Count: 1, Fence: x.token}}
	}
	if err := d.fence(ctx, timeout, ops, token, results); err != nil {
		for _, x := range got {
			d.releaseGrant(ops.keys, ops.req.Owner, x.i, x.token)
		}
		return driver.Grant{}, false, nil
	}
	d.book(ops, sent)
	if d.gate.Stopped() {
		return driver.Grant{}, false, fmt.Errorf("redlock: acquire: granted while closing, released by Close: %w", dlock.ErrClosed)
	}
	d.grantsTaken.Add(1)
	// The nodes that did not grant (yet) are left alone: their grant,
	// usually a moment behind, is the holder's (grantMessage keeps it),
	// released with the lease; a node that has not granted by then takes
	// the owner out of its queue on that release (grantReleaseSrc), and
	// otherwise the entry, no longer renewed, ends after queueWait.
	return driver.Grant{Token: token, Count: 1, Key: ops.keys.Lock, Handle: &handle{ref: ops.ref}, Sent: sent}, true, nil
}
