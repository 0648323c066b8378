package redlock

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/redisscript"
)

// Subscribe registers for release notifications of name on every node,
// over each node's single shared pub/sub connection (see redislock's
// Subscribe). A release publishes its token on every node; the first copy
// to arrive wakes one waiter of this driver, the others are dropped. It
// fails only if no node can be subscribed.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	ch := redisscript.KeysFor(d.prefix, name).Channel
	sig := make(chan struct{}, 1)
	subs, err := d.subscribeEach(ctx, ch, sig)
	if err != nil {
		return nil, ctxerr.Wrap(ctx, "redlock: subscribe", err)
	}
	return redisscript.NewSubscription(sig, subs...), nil
}

// subscribeEach registers sig on channel on every node's hub at once (see
// redisscript.SubscribeEach), each within the node timeout, and waits for
// every node: a waiter needs a quorum of copies of a grant message naming
// it, so a node that is merely slow must not be left out. It returns the
// registrations made, or an error when no node could be subscribed.
func (d *Driver) subscribeEach(ctx context.Context, channel string, sig chan struct{}) ([]*redisscript.Sub, error) {
	hubs := make([]*redisscript.Hub, len(d.nodes))
	for i, n := range d.nodes {
		hubs[i] = n.hub
	}
	subs, err := redisscript.SubscribeEach(ctx, hubs, d.timeoutFor(0), len(hubs), channel, "", sig)
	return slices.DeleteFunc(subs, func(s *redisscript.Sub) bool { return s == nil }), err
}

// dedupeWindow is how long a release message counts as a copy of one
// received from another node with the same channel and token.
const dedupeWindow = time.Second

// dedupe lets one release, published on every node, wake the driver's
// waiters once: it passes the first message per channel and token. A
// message naming the first queued waiter ("token\nowner") passes from its
// quorum-th copy on instead; each copy of it is routed to the waiter with
// the node it came from (see waiter).
type dedupe struct {
	mu     sync.Mutex
	last   map[string]seenMsg
	quorum int // copies of a message naming a waiter that wake it (0: 1)
}

type seenMsg struct {
	payload string
	at      time.Time
	copies  int
}

// see reports whether a message passes (the first copy of a message
// naming nobody, or a quorum-th or later copy of one naming a waiter) and
// how many copies of it have come so far (this one included), 0 for a
// repeat of a message naming nobody.
func (dd *dedupe) see(channel, payload string) (pass bool, copies int) {
	now := time.Now()
	dd.mu.Lock()
	defer dd.mu.Unlock()
	targeted := strings.IndexByte(payload, '\n') >= 0
	if targeted {
		// Copies of other messages on the channel may come in between.
		channel += "\x00" + payload
	}
	if s, ok := dd.last[channel]; ok && s.payload == payload && now.Sub(s.at) < dedupeWindow {
		if !targeted {
			return false, 0
		}
		s.copies++
		dd.last[channel] = s
		return s.copies >= dd.quorum, s.copies
	}
	if dd.last == nil {
		dd.last = map[string]seenMsg{}
	}
	if len(dd.last) >= 4096 {
		for ch, s := range dd.last {
			if now.Sub(s.at) >= dedupeWindow {
				delete(dd.last, ch)
			}
		}
	}
	dd.last[channel] = seenMsg{payload: payload, at: now, copies: 1}
	return !targeted || dd.quorum <= 1, 1
}

// listenLinger is how long a channel stays subscribed after its last
// waiting Lock returned: a lock taken and freed in turn by the driver's
// callers (a hot lock) then costs no SUBSCRIBE and UNSUBSCRIBE per Lock, and
// no retry for the subscription's confirmation.
const listenLinger = 2 * time.Second

// listeners are the channels the driver's waiting Locks (Acquire) listen
// on, one subscription per channel and node shared by all of them: a
// release naming a waiter (its quorum-th copy, see dedupe) wakes that
// waiter through route; any other wake-up of the subscription (its
// confirmation by a node, a lost connection, a release naming nobody)
// wakes every waiter of the channel.
type listeners struct {
	mu sync.Mutex
	m  map[string]*listener
	// closed is set by Close: no new listeners.
	closed bool
}

type listener struct {
	channel string
	subs    []*redisscript.Sub
	sig     chan struct{}      // the subscriptions' wake-ups
	owners  map[string]*waiter // the waiters, by owner
	linger  *time.Timer        // pending unsubscribe (no waiters left)
	done    chan struct{}      // closed when the listener stops
}

// waiter is one waiting Lock's wake-ups: sig is signalled for each, and
// nodes has bit i set when node i published a release naming the waiter
// (node i is then free, and the waiter first in its queue), until the
// waiter takes the bits (see stagger).
type waiter struct {
	sig   chan struct{}
	nodes atomic.Uint64
	// grants are the grants releases made for the waiter (see grant.go);
	// nil for a waiter that does not ask for them.
	grants *grantState
}

func newWaiter() *waiter { return &waiter{sig: make(chan struct{}, 1)} }

func (w *waiter) wake() {
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

// listen registers the waiting Lock of owner on channel: w receives its
// wake-ups. fresh reports whether the channel was not subscribed yet on
// this driver (the caller must try once more: a release before the
// subscription took effect is not heard). It fails only when no node
// could be subscribed or the driver is closing.
func (d *Driver) listen(ctx context.Context, channel, owner string, w *waiter) (fresh bool, err error) {
	ls := &d.listeners
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return false, errClosed
	}
	if l := ls.m[channel]; l != nil {
		if l.linger != nil {
			l.linger.Stop()
			l.linger = nil
		}
		l.owners[owner] = w
		ls.mu.Unlock()
		return false, nil
	}
	ls.mu.Unlock()
	l := &listener{channel: channel, sig: make(chan struct{}, 1), owners: map[string]*waiter{owner: w}, done: make(chan struct{})}
	subs, err := d.subscribeEach(ctx, channel, l.sig)
	if err != nil {
		return false, err
	}
	l.subs = subs
	ls.mu.Lock()
	if other := ls.m[channel]; other != nil || ls.closed {
		// Another waiter subscribed the channel meanwhile (or Close began):
		// join it, and drop ours.
		if other != nil {
			if other.linger != nil {
				other.linger.Stop()
				other.linger = nil
			}
			other.owners[owner] = w
		}
		closed := ls.closed
		ls.mu.Unlock()
		for _, s := range l.subs {
			s.Close(false)
		}
		if closed {
			return false, errClosed
		}
		return true, nil
	}
	if ls.m == nil {
		ls.m = map[string]*listener{}
	}
	ls.m[channel] = l
	ls.mu.Unlock()
	go l.forward(&d.listeners)
	return true, nil
}

// forward passes the subscriptions' wake-ups to every waiter.
func (l *listener) forward(ls *listeners) {
	for {
		select {
		case <-l.done:
			return
		case <-l.sig:
		}
		ls.mu.Lock()
		for _, w := range l.owners {
			w.wake()
		}
		ls.mu.Unlock()
	}
}

// unlisten removes owner's waiter from channel; the channel is
// unsubscribed listenLinger after its last waiter left, unless another
// comes.
func (d *Driver) unlisten(channel, owner string) {
	ls := &d.listeners
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.m[channel]
	if l == nil {
		return
	}
	delete(l.owners, owner)
	if len(l.owners) > 0 || l.linger != nil || ls.closed {
		return
	}
	l.linger = time.AfterFunc(listenLinger, func() {
		ls.mu.Lock()
		if ls.m[channel] != l || len(l.owners) > 0 || ls.closed {
			ls.mu.Unlock()
			return
		}
		delete(ls.m, channel)
		close(l.done)
		ls.mu.Unlock()
		for _, s := range l.subs {
			s.Close(false)
		}
	})
}

// route tells the waiter owner of channel, if it is one of the driver's,
// that node published a release naming it, and wakes it.
func (d *Driver) route(channel, owner string, node int) {
	ls := &d.listeners
	ls.mu.Lock()
	if l := ls.m[channel]; l != nil {
		if w := l.owners[owner]; w != nil {
			w.nodes.Or(1 << node)
			w.wake()
		}
	}
	ls.mu.Unlock()
}

// closeListeners stops every listener (Close, before the hubs close). It
// returns the grants the waiters were sent and have not used (see
// grant.go), for Close to release: a grant message that comes later
// finds no waiter and is released as it comes.
func (d *Driver) closeListeners() []unusedGrant {
	ls := &d.listeners
	ls.mu.Lock()
	ls.closed = true
	m := ls.m
	ls.m = nil
	var unused []unusedGrant
	for _, l := range m {
		if l.linger != nil {
			l.linger.Stop()
		}
		close(l.done)
		k, ok := redisscript.KeysOfChannel(l.channel)
		for owner, w := range l.owners {
			if w.grants == nil || !ok {
				continue
			}
			for i, t := range w.grants.tokens() {
				if t != 0 {
					unused = append(unused, unusedGrant{k: k, owner: owner, node: i, token: t})
				}
			}
		}
	}
	ls.mu.Unlock()
	return unused
}

// filterAt is the message filter of node's hub: dedupe's verdict, and
// every copy of a release naming a waiter of the driver's is routed to it
// with the node it came from.
func (d *Driver) filterAt(node int) func(channel, payload string) bool {
	return func(channel, payload string) bool {
		if channel == d.grantCh {
			d.grantMessage(node, payload)
			return false
		}
		pass, copies := d.seen.see(channel, payload)
		if copies == 0 {
			return false
		}
		if i := strings.IndexByte(payload, '\n'); i >= 0 {
			d.route(channel, payload[i+1:], node)
		}
		return pass
	}
}

// listened reports whether the driver listens on channel already.
func (d *Driver) listened(channel string) bool {
	ls := &d.listeners
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.m[channel] != nil
}
