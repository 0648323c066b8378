package redislock

import (
	"context"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

// Grant-in-release (docs/protocol.md, "Grant-in-release"): a waiting
// Acquire asks, with each refused attempt after its first, to be granted
// the lock by the release that frees it; the release script then sets the
// lock to the waiter (a new token, the waiter's TTL and lock-delay) and
// publishes the grant on the waiter's driver's grant channel, so that a
// hand-off is a release plus one message, not a wake-up plus another
// script call. Redlock does the same on each of its nodes and needs a
// quorum of such messages; here one is the grant.
//
// Why a grant message can be trusted, and from when its lease counts: a
// refused attempt sent at S and run by the server at E reports the fencing
// counter C as it was at E. A grant carries the token its release made,
// the counter + 1, and tokens only grow, so a grant whose token is above C
// was made after E, and so after S: its lease (PX TTL from the grant) lasts
// at least until S + TTL. The waiter keeps the latest S of a refused
// attempt and the largest counter reported, raised further by every token
// an attempt's reply gave it (so that the message of a grant the waiter's
// next attempt adopted, with a fresh token, never counts). A grant message
// counts when its token is above that; its lease is measured from S. When
// that leaves less than two thirds of the TTL, the waiter tries again
// instead, which adopts the grant with a fresh lease.
//
// A dead waiter is not granted: the release makes the grant only when its
// message reached a subscriber (the driver's pub/sub connection is up). A
// grant for a waiter that has gone (its Acquire returned) is released by
// token when its message arrives, unless its owner holds the lock through
// this driver; a waiter that gives up releases the grant it was sent and
// did not use.
//
// The plain layout does not ask for grants (a grant message names the
// lock by its release channel, from which the plain layout's lock key
// cannot be told), nor does a driver with MinReplicas (a grant made by
// another client's release is not covered by this driver's WAIT).

// minGrantValidity is the share of the TTL a grant message must leave
// (measured from the send time its lease counts from) for the waiter to
// hold the lock on it: less, and it tries again instead.
const minGrantValidity = 3 // thirds: the lease is not older than TTL/3

// grantWaiter is one waiting Acquire that asks for grants.
type grantWaiter struct {
	sig chan struct{} // the Acquire's wake-up, shared with its release-channel subscription

	mu    sync.Mutex
	sent  time.Time // latest send time of a refused attempt (zero: none answered)
	floor uint64    // a grant message counts if its token is above this
	token uint64    // largest token of a grant message, 0 for none
}

// refused records a refused attempt sent at sent, which saw the fencing
// counter at counter.
func (w *grantWaiter) refused(sent time.Time, counter uint64) {
	w.mu.Lock()
	if sent.After(w.sent) {
		w.sent = sent
	}
	w.floor = max(w.floor, counter)
	w.mu.Unlock()
}

// granted records that an attempt's reply granted (or adopted) token, or
// that the waiter took the grant of token's message: a grant message with
// that token or a smaller one is no grant the waiter still has.
func (w *grantWaiter) granted(token uint64) {
	w.mu.Lock()
	w.floor = max(w.floor, token)
	w.mu.Unlock()
}

// offer records a grant message's token and wakes the waiter.
func (w *grantWaiter) offer(token uint64) {
	w.mu.Lock()
	w.token = max(w.token, token)
	w.mu.Unlock()
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

// counted returns the token of a grant message that counts and the send
// time its lease counts from; ok is false when there is none.
func (w *grantWaiter) counted() (token uint64, sent time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sent.IsZero() || w.token <= w.floor {
		return 0, time.Time{}, false
	}
	return w.token, w.sent, true
}

// waiterKey names a waiting Acquire: its lock's release channel and its
// owner, as a grant message does.
type waiterKey struct{ channel, owner string }

// grantWaiters are the driver's waiting Acquires that ask for grants.
type grantWaiters struct {
	mu sync.Mutex
	m  map[waiterKey]*grantWaiter
}

// add registers a waiter for (channel, owner) waking sig, or returns nil
// when another waiting Acquire of that owner has (it then does not ask for
// grants).
func (ws *grantWaiters) add(channel, owner string, sig chan struct{}) *grantWaiter {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	key := waiterKey{channel, owner}
	if ws.m[key] != nil {
		return nil
	}
	if ws.m == nil {
		ws.m = map[waiterKey]*grantWaiter{}
	}
	w := &grantWaiter{sig: sig}
	ws.m[key] = w
	return w
}

// remove unregisters w, and returns the token of a grant it was sent and
// did not use (0: none).
func (ws *grantWaiters) remove(channel, owner string, w *grantWaiter) uint64 {
	ws.mu.Lock()
	if key := (waiterKey{channel, owner}); ws.m[key] == w {
		delete(ws.m, key)
	}
	ws.mu.Unlock()
	token, _, ok := w.counted()
	if !ok {
		return 0
	}
	return token
}

func (ws *grantWaiters) get(channel, owner string) *grantWaiter {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.m[waiterKey{channel, owner}]
}

// subscribeGrants subscribes the driver's grant channel if it is not yet,
// trying at most once a second (best effort: without it a release wakes
// the waiter instead of granting it, since its publish reaches nobody).
func (d *Driver) subscribeGrants(ctx context.Context) bool {
	d.grantMu.Lock()
	defer d.grantMu.Unlock()
	if d.grantSubbed {
		return true
	}
	if time.Since(d.grantTried) < time.Second {
		return false
	}
	d.grantTried = time.Now()
	if _, err := d.hub.Subscribe(ctx, d.grantCh, d.grantSig); err != nil {
		return false
	}
	d.grantSubbed = true
	return true
}

// hubFilter passes the release channels' messages to the hub's waiters and
// takes the grant channel's itself.
func (d *Driver) hubFilter(channel, payload string) bool {
	if channel != d.grantCh {
		return true
	}
	d.grantMessage(payload)
	return false
}

// grantMessage handles a grant message (see redisscript.ParseGrantMessage):
// the waiter it names gets it, or, if it has no waiting Acquire here and
// does not hold the lock through this driver, the grant is released (by
// token, so that nothing newer is touched).
func (d *Driver) grantMessage(payload string) {
	m, ok := redisscript.ParseGrantMessage(payload)
	if !ok {
		return
	}
	if w := d.waiters.get(m.Channel, m.Owner); w != nil {
		w.offer(m.Token)
		return
	}
	k, ok := redisscript.KeysOfChannel(m.Channel)
	if !ok || d.grants.Has(k.Lock, m.Owner) {
		return
	}
	d.releaseGrant(k, m.Owner, m.Token)
}

// releaseGrant releases owner's grant token of k (handing the lock on to
// the next waiter) in the background, or, once Close has begun, at once.
func (d *Driver) releaseGrant(k redisscript.Keys, owner string, token uint64) {
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _, _ = redisscript.ReleaseGranting(ctx, d.client, k, owner, token)
	}
	if !d.gate.Enter() {
		run()
		return
	}
	d.gate.Add(1)
	d.gate.Exit()
	go func() {
		defer d.gate.Done()
		run()
	}()
}

// takeGrant turns w's grant message into the waiter's grant, if it counts
// and leaves enough validity; ok is false when the waiter must try again
// instead.
func (d *Driver) takeGrant(ref *redisscript.Ref, k redisscript.Keys, req driver.AcquireRequest, w *grantWaiter) (g driver.Grant, ok bool, err error) {
	token, sent, ok := w.counted()
	if !ok || time.Since(sent) > req.TTL/minGrantValidity {
		return driver.Grant{}, false, nil
	}
	if !d.gate.Enter() {
		return driver.Grant{}, false, errClosed
	}
	w.granted(token)
	d.grants.GrantedRef(ref, req.Owner, req.TTL, sent)
	d.gate.Exit()
	if d.gate.Stopped() {
		return driver.Grant{}, false, errGrantedClosing
	}
	d.grantsTaken.Add(1)
	return driver.Grant{Token: token, Count: 1, Sent: sent, Key: k.Lock, Handle: ref}, true, nil
}
