package redisscript

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/redis/go-redis/v9"
)

// Hub multiplexes the release channels of many waiters over one pub/sub
// connection to one server. Each channel is subscribed once per hub, when its
// first waiter arrives, and unsubscribed when its last waiter leaves.
//
// A release message of a read/write lock or a semaphore (starting with
// '*', see kindPrelude) wakes every waiter of the channel. A mutex's
// release message naming a queued waiter (token, newline, owner: see
// releaseSrc) wakes that waiter only, if it is registered on this hub with
// SubscribeOwner, and nobody else. Any other release message wakes one
// waiter of the hub, the one waiting longest that has no wake-up pending: only one waiter can win the lock, so waking
// every waiter of a process would only send them all to the server to lose.
// A waiter that leaves with an unconsumed wake-up passes it on to the next.
// Every process (hub) subscribed to the channel gets the message, so one
// release wakes one waiter per process.
//
// A waiter is also woken, spuriously, whenever the server confirms its
// channel's subscription (so a release that happened before the subscription
// took effect is caught by one more attempt) and whenever the connection
// fails (messages may have been lost while it was down).
//
// With SetLinger, a channel stays subscribed for a while after its last
// waiter left (see Join).
//
// A Hub is safe for concurrent use.
type Hub struct {
	client redis.UniversalClient
	filter func(channel, payload string) bool

	opMu sync.Mutex // serialises SUBSCRIBE/UNSUBSCRIBE with the map updates
	mu   sync.Mutex // guards the fields below
	ps   *redis.PubSub
	subs map[string][]*Sub // by channel, oldest first

	// linger is how long a channel stays subscribed with no waiter (0:
	// none); idle holds such channels, with when their last waiter left,
	// and sweep is armed to unsubscribe them while idle is not empty.
	linger time.Duration
	idle   map[string]time.Time
	sweep  *time.Timer

	closed bool
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the receive loop has exited
}

// Sub is one waiter's registration on a Hub.
type Sub struct {
	hub     *Hub
	channel string
	owner   string // queued waiter's owner ("" for none)
	sig     chan struct{}
	gone    bool // guarded by hub.mu
}

// NewHub returns a hub that opens its pub/sub connection from client on
// first use. Close stops it; it never closes client. If filter is not nil,
// a release message wakes a waiter only when filter returns true for it
// (Redlock uses this to let one release, published on every node, wake one
// waiter rather than one per node).
func NewHub(client redis.UniversalClient, filter func(channel, payload string) bool) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{client: client, filter: filter, subs: map[string][]*Sub{}, ctx: ctx, cancel: cancel}
}

var errHubClosed = errors.New("release notifications closed")

// maxIdle bounds the channels a lingering hub keeps subscribed with no
// waiter: past it, a channel's last waiter unsubscribes it at once.
const maxIdle = 1024

// SetLinger keeps each channel subscribed for d after its last waiter left
// (0, the default: unsubscribed at once), at most maxIdle of them. A lock
// taken in turn by the hub's waiters (a hot lock) then costs no SUBSCRIBE
// and UNSUBSCRIBE per waiting Lock, and a waiter can Join the channel
// without a round trip. Call it before the hub is used.
func (h *Hub) SetLinger(d time.Duration) {
	h.mu.Lock()
	h.linger = d
	h.mu.Unlock()
}

// Listening reports whether the hub is subscribed to channel (it has a
// waiter, or its last one left within the linger).
func (h *Hub) Listening(channel string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, idle := h.idle[channel]
	return idle || len(h.subs[channel]) > 0
}

// Join is SubscribeOwner for a channel the hub is subscribed to already
// (it has a waiter, or its last one left within the linger): it sends no
// command, and returns nil when the channel is not subscribed. A release
// the server runs after Join returns wakes the waiter as SubscribeOwner's
// would (the subscription took effect before), so a caller can try once
// and then wait, without the retry a new subscription needs.
func (h *Hub) Join(channel, owner string, sig chan struct{}) *Sub {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	if _, idle := h.idle[channel]; !idle && len(h.subs[channel]) == 0 {
		return nil
	}
	delete(h.idle, channel)
	s := &Sub{hub: h, channel: channel, owner: owner, sig: sig}
	h.subs[channel] = append(h.subs[channel], s)
	return s
}

// Subscribe registers a waiter on channel. Wake-ups are sent to sig without
// blocking (sig should have a buffer of 1); several subscriptions may share
// one sig. It returns once the SUBSCRIBE command is written, without waiting
// for the server's confirmation (the confirmation wakes the waiter instead).
func (h *Hub) Subscribe(ctx context.Context, channel string, sig chan struct{}) (*Sub, error) {
	return h.SubscribeOwner(ctx, channel, "", sig)
}

// SubscribeOwner is Subscribe for the queued waiter owner: release messages
// that name owner wake it (and only it), besides the wake-ups of Subscribe.
func (h *Hub) SubscribeOwner(ctx context.Context, channel, owner string, sig chan struct{}) (*Sub, error) {
	h.opMu.Lock()
	defer h.opMu.Unlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, errHubClosed
	}
	if h.ps == nil {
		h.ps = h.client.Subscribe(h.ctx)
		h.done = make(chan struct{})
		go h.receive(h.ps, h.done)
	}
	s := &Sub{hub: h, channel: channel, owner: owner, sig: sig}
	_, idle := h.idle[channel]
	delete(h.idle, channel)
	first := len(h.subs[channel]) == 0 && !idle
	h.subs[channel] = append(h.subs[channel], s)
	ps := h.ps
	h.mu.Unlock()
	if !first {
		return s, nil
	}
	if err := ps.Subscribe(ctx, channel); err != nil {
		h.mu.Lock()
		h.remove(s)
		last := len(h.subs[channel]) == 0
		h.mu.Unlock()
		if last {
			// go-redis remembers the channel even when the write failed.
			_ = ps.Unsubscribe(context.WithoutCancel(ctx), channel)
		}
		return nil, err
	}
	return s, nil
}

// Close removes the waiter. If passOn is true the waiter had an unconsumed
// wake-up, which goes to the next waiter of the channel. Close is
// idempotent.
func (s *Sub) Close(passOn bool) {
	h := s.hub
	h.opMu.Lock()
	defer h.opMu.Unlock()
	h.mu.Lock()
	if s.gone {
		h.mu.Unlock()
		return
	}
	h.remove(s)
	last := len(h.subs[s.channel]) == 0
	if passOn && !last {
		h.wakeOne(s.channel)
	}
	ps, closed := h.ps, h.closed
	if last && !closed && h.linger > 0 && len(h.idle) < maxIdle {
		if h.idle == nil {
			h.idle = map[string]time.Time{}
		}
		h.idle[s.channel] = time.Now()
		if h.sweep == nil {
			h.sweep = time.AfterFunc(h.linger, h.sweepIdle)
		}
		last = false
	}
	h.mu.Unlock()
	if last && !closed && ps != nil {
		h.unsubscribe(ps, s.channel)
	}
}

// unsubscribe unsubscribes channels on ps. A failed write leaves the
// connection to be re-established without them, which is what we want.
func (h *Hub) unsubscribe(ps *redis.PubSub, channels ...string) {
	ctx, cancel := context.WithTimeout(h.ctx, 5*time.Second)
	_ = ps.Unsubscribe(ctx, channels...)
	cancel()
}

// sweepIdle unsubscribes the channels that have had no waiter for the
// linger, and arms itself again for the others.
func (h *Hub) sweepIdle() {
	h.opMu.Lock()
	defer h.opMu.Unlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	now := time.Now()
	var gone []string
	next := time.Duration(0)
	for ch, since := range h.idle {
		if left := h.linger - now.Sub(since); left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		gone = append(gone, ch)
		delete(h.idle, ch)
	}
	h.sweep = nil
	if next > 0 {
		h.sweep = time.AfterFunc(next, h.sweepIdle)
	}
	ps := h.ps
	h.mu.Unlock()
	if len(gone) > 0 && ps != nil {
		h.unsubscribe(ps, gone...)
	}
}

// remove drops s from its channel's list. h.mu must be held.
func (h *Hub) remove(s *Sub) {
	s.gone = true
	list := h.subs[s.channel]
	for i, x := range list {
		if x == s {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(h.subs, s.channel)
	} else {
		h.subs[s.channel] = list
	}
}

// wakeOne wakes the oldest waiter on channel that has no wake-up pending.
// h.mu must be held.
func (h *Hub) wakeOne(channel string) {
	for _, s := range h.subs[channel] {
		select {
		case s.sig <- struct{}{}:
			return
		default:
		}
	}
}

// wakeFor delivers a release message: to the waiter it names, or else to
// the oldest waiter (see Hub). h.mu must be held.
func (h *Hub) wakeFor(channel, payload string) {
	if strings.HasPrefix(payload, "*") {
		// A release of a read/write lock or a semaphore (see
		// kindPrelude): it may let several waiters in, of kinds the hub
		// does not know.
		h.wakeAll(channel)
		return
	}
	i := strings.IndexByte(payload, '\n')
	if i < 0 {
		h.wakeOne(channel)
		return
	}
	owner := payload[i+1:]
	for _, s := range h.subs[channel] {
		if s.owner == owner {
			select {
			case s.sig <- struct{}{}:
			default:
			}
			return
		}
	}
}

// wakeAll wakes every waiter on channel, or on every channel when channel is
// empty. h.mu must be held.
func (h *Hub) wakeAll(channel string) {
	for ch, list := range h.subs {
		if channel != "" && ch != channel {
			continue
		}
		for _, s := range list {
			select {
			case s.sig <- struct{}{}:
			default:
			}
		}
	}
}

// healthEvery is how often an idle pub/sub connection is pinged.
const healthEvery = 15 * time.Second

func (h *Hub) receive(ps *redis.PubSub, done chan struct{}) {
	defer close(done)
	backoff := 20 * time.Millisecond
	for {
		msg, err := ps.ReceiveTimeout(h.ctx, healthEvery)
		if h.ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				_ = ps.Ping(h.ctx)
				continue
			}
			// The connection failed; go-redis reconnects and resubscribes
			// on the next receive. Anything published meanwhile is lost.
			h.mu.Lock()
			h.wakeAll("")
			h.mu.Unlock()
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-h.ctx.Done():
				t.Stop()
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 20 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			if h.filter != nil && !h.filter(m.Channel, m.Payload) {
				continue
			}
			h.mu.Lock()
			h.wakeFor(m.Channel, m.Payload)
			h.mu.Unlock()
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.mu.Lock()
				h.wakeAll(m.Channel)
				h.mu.Unlock()
			}
		}
	}
}

// Close stops the hub: it closes the pub/sub connection and waits for the
// receive loop to exit. Waiters still registered get no more wake-ups.
func (h *Hub) Close() error {
	h.opMu.Lock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.opMu.Unlock()
		return nil
	}
	h.closed = true
	if h.sweep != nil {
		h.sweep.Stop()
		h.sweep = nil
	}
	ps, done := h.ps, h.done
	h.mu.Unlock()
	h.opMu.Unlock()
	h.cancel()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	return err
}

// Subscription is a driver.Subscription over one waiter's Subs, one per hub
// (per Redlock node), which all wake the same signal channel.
type Subscription struct {
	sig  chan struct{}
	subs []*Sub
	once sync.Once
}

var _ driver.Subscription = (*Subscription)(nil)

// NewSubscription returns the subscription of subs, which were registered
// with sig.
func NewSubscription(sig chan struct{}, subs ...*Sub) *Subscription {
	return &Subscription{sig: sig, subs: subs}
}

// C receives the waiter's wake-ups.
func (s *Subscription) C() <-chan struct{} { return s.sig }

// Close removes the waiter from every hub. A wake-up it did not consume is
// passed on, once, to the next waiter of the channel. Close is idempotent
// and returns nil.
func (s *Subscription) Close() error {
	s.once.Do(func() {
		pending := false
		select {
		case <-s.sig:
			pending = true
		default:
		}
		for i, sub := range s.subs {
			sub.Close(pending && i == 0)
		}
	})
	return nil
}
