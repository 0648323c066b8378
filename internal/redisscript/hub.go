package redisscript

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/gather"
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

	// op serialises SUBSCRIBE/UNSUBSCRIBE with the map updates: a token
	// channel rather than a mutex, so that a caller can stop waiting for
	// it when its context ends. A server that stops answering (paused,
	// partitioned) can keep a go-redis pub/sub call, and so op, busy for
	// the dial timeout; no caller waits for that past its context.
	op chan struct{}
	// bg counts the goroutines that finish a subscription after its
	// caller stopped waiting, and the background unsubscriptions; Close
	// waits for them.
	bg   sync.WaitGroup
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
	return &Hub{client: client, filter: filter, subs: map[string][]*Sub{}, op: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
}

// lockOp takes op, or gives up with ctx's error when ctx ends first.
func (h *Hub) lockOp(ctx context.Context) error {
	select {
	case h.op <- struct{}{}:
		return nil
	default:
	}
	select {
	case h.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Hub) unlockOp() { <-h.op }

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
	if err := h.lockOp(ctx); err != nil {
		return nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.unlockOp()
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
		h.unlockOp()
		return s, nil
	}
	// The SUBSCRIBE runs in a goroutine that holds op until it ends:
	// go-redis can block it past ctx (its pub/sub mutex, held while the
	// receive loop redials a server that does not answer, is not bound
	// by ctx). The caller waits for it only while ctx lasts.
	res := make(chan error, 1)
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		sctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(h.ctx, cancel)
		err := ps.Subscribe(sctx, channel)
		stop()
		cancel()
		if err != nil {
			h.mu.Lock()
			h.remove(s)
			h.mu.Unlock()
			// go-redis remembers the channel even when the write
			// failed.
			h.unsubscribeUnused(ps, channel)
		}
		h.unlockOp()
		res <- err
	}()
	select {
	case err := <-res:
		if err != nil {
			return nil, err
		}
		return s, nil
	case <-ctx.Done():
		// The subscription is finished (or undone) in the background.
		s.Close(false)
		return nil, ctx.Err()
	}
}

// SubscribeEach registers one waiter on channel on each of hubs (one per
// Redlock node), all at once, each hub's SUBSCRIBE bounded by timeout as
// well as by ctx, and returns what it registered, indexed like hubs (nil
// where a hub failed or was nil), or the first error (naming its hub's
// index as "node i") when it registered nothing. It returns once every hub has answered, or once want of them
// have registered and the others have had as long again as that took (at
// least 2 ms): a node that does not answer (paused, cut off) costs a
// waiter at most timeout, and nothing once want nodes are listening. A
// registration that completes after it returned is closed.
func SubscribeEach(ctx context.Context, hubs []*Hub, timeout time.Duration, want int, channel, owner string, sig chan struct{}) ([]*Sub, error) {
	type result struct {
		i   int
		s   *Sub
		err error
	}
	var (
		mu       sync.Mutex
		returned bool
	)
	results := make(chan result, len(hubs))
	pending := 0
	for i, h := range hubs {
		if h == nil {
			continue
		}
		pending++
		go func() {
			hctx, cancel := context.WithTimeout(ctx, timeout)
			s, err := h.SubscribeOwner(hctx, channel, owner, sig)
			cancel()
			mu.Lock()
			defer mu.Unlock()
			if returned {
				if s != nil {
					s.Close(false)
				}
				return
			}
			results <- result{i, s, err}
		}()
	}
	subs := make([]*Sub, len(hubs))
	n := 0
	var firstErr error
	for _, r := range gather.Quorum(results, pending, want, func(r result) bool { return r.err == nil }) {
		if r.err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
			continue
		}
		subs[r.i] = r.s
		n++
	}
	mu.Lock()
	returned = true
	for len(results) > 0 {
		if r := <-results; r.err == nil {
			subs[r.i] = r.s
			n++
		}
	}
	mu.Unlock()
	if n == 0 {
		if firstErr == nil {
			firstErr = errors.New("no node to subscribe")
		}
		return nil, firstErr
	}
	return subs, nil
}

// Close removes the waiter. If passOn is true the waiter had an unconsumed
// wake-up, which goes to the next waiter of the channel. Close is
// idempotent.
func (s *Sub) Close(passOn bool) {
	h := s.hub
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
	if last && !closed && ps != nil {
		// Unsubscribed in the background, so that Close never waits for
		// the server (see Hub.op).
		h.bg.Add(1)
		go func() {
			defer h.bg.Done()
			if h.lockOp(h.ctx) != nil {
				return
			}
			defer h.unlockOp()
			h.unsubscribeUnused(ps, s.channel)
		}()
	}
	h.mu.Unlock()
}

// unsubscribeUnused unsubscribes those of channels that have no waiter
// and are not lingering (a waiter may have come since the caller looked).
// op must be held.
func (h *Hub) unsubscribeUnused(ps *redis.PubSub, channels ...string) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	unused := channels[:0:0]
	for _, ch := range channels {
		if _, idle := h.idle[ch]; !idle && len(h.subs[ch]) == 0 {
			unused = append(unused, ch)
		}
	}
	h.mu.Unlock()
	if len(unused) > 0 {
		h.unsubscribe(ps, unused...)
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
	if h.lockOp(h.ctx) != nil {
		return // closed
	}
	defer h.unlockOp()
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
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	if h.sweep != nil {
		h.sweep.Stop()
		h.sweep = nil
	}
	h.mu.Unlock()
	// Cancelling h.ctx ends the pub/sub calls in flight and the waits for
	// op; then nothing touches h.ps but the receive loop.
	h.cancel()
	h.op <- struct{}{}
	h.mu.Lock()
	ps, done := h.ps, h.done
	h.mu.Unlock()
	<-h.op
	h.bg.Wait()
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
