// Package redlock is the dlock driver for Redlock: one lock taken on a
// majority of N independent Redis masters, as antirez described it.
//
// Import it for its side effect to make the redlock:// URL scheme available
// to dlock.Open:
//
//	import _ "github.com/dlock/dlock/redlock"
//
//	client, err := dlock.Open(ctx, "redlock://h1:6379,h2:6379,h3:6379")
//
// or construct a driver over go-redis clients you already have with New.
// The nodes must be independent masters (not replicas of each other, not
// one cluster): Redlock's fault tolerance comes from their independence.
//
// # The algorithm
//
// An acquire sends the same Lua script as the redislock driver (same key
// layout, owner token, PX expiry, re-entrance count, lock-delay) to every
// node in parallel, each call bounded by a per-node timeout much shorter
// than the TTL. It succeeds when a quorum of N/2+1 nodes granted it and the
// time spent is still inside the TTL minus the drift margin (TTL/100 + 2ms);
// the lease's validity is then TTL − drift measured from when the requests
// were sent (the dlock package keeps that deadline). Otherwise it releases
// on every node that granted (or may have granted) at once and reports the
// lock as held (ErrLocked, with a retry hint) or, when fewer than a quorum
// of nodes answered, as an error. Renewal must reach a quorum, or the lease
// is not confirmed; release goes to every node.
//
// # Fencing
//
// Each node keeps its own fencing counter, incremented by the acquire
// script. The token of a grant is the maximum counter returned by the
// granting nodes, which is one more than the largest counter among them,
// and it is written back (each counter raised to at least the token) to a
// quorum before the grant is returned. Any two quorums intersect, so a later
// grant sees a counter at least this token on some node and gets a larger
// one, provided (1) the write-back finished while the grant was still valid
// (the driver checks this on its monotonic clock, under Redlock's usual
// assumption that the nodes' clocks run at nearly the same rate), and (2) no
// node lost its counter: a node restarted empty resets its counter to 0.
// Run the nodes with appendonly yes and appendfsync always, or restart a
// crashed node only after the longest TTL in use has passed and with its
// old data; see docs/backends.md.
package redlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

func init() {
	dlock.Register("redlock", openURL)
}

// DefaultKeyPrefix is the prefix of every key and channel when
// Options.KeyPrefix is empty.
const DefaultKeyPrefix = redisscript.DefaultPrefix

// MaxNodeTimeout caps the default per-node timeout.
const MaxNodeTimeout = 500 * time.Millisecond

// Options configure a Driver. The zero value (or nil) gives the defaults.
// Each field maps to the URL query parameter named in its comment.
type Options struct {
	// KeyPrefix is prepended to every key and channel on every node (URL
	// parameter key_prefix). It must not contain '{', '}', glob characters
	// (*?[]\) or control characters. Default "dlock:".
	KeyPrefix string
	// NodeTimeout bounds each node's part of an acquire, release or
	// write-back (URL parameter node_timeout). It should be much shorter
	// than the TTL, so that a dead node costs little of the validity.
	// Default: TTL/10, at most MaxNodeTimeout (500ms). An acquire returns
	// as soon as a quorum granted it, so a hung node delays only failed
	// acquires and releases by this much. Renewal gives each
	// node up to a third of the shortest lease's TTL instead, since a batch
	// of many leases takes longer than one acquire.
	NodeTimeout time.Duration
}

// Driver is a Redlock dlock driver over N go-redis clients, one per
// independent Redis master. It implements driver.Driver, driver.Notifier,
// driver.Inspector and driver.Limiter, and is safe for concurrent use.
type Driver struct {
	nodes       []*node
	quorum      int
	prefix      string
	nodeTimeout time.Duration
	own         bool // Close closes the clients (opened from a URL)

	callMu    sync.RWMutex   // guards stopped, orders calls.Add before calls.Wait
	stopped   bool           // no new node calls (Close or kill began)
	calls     sync.WaitGroup // node calls still running after their caller moved on
	seen      dedupe         // release messages already delivered
	closeOnce sync.Once
	closeErr  error
}

type node struct {
	client redis.UniversalClient
	hub    *redisscript.Hub
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Notifier  = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
	_ driver.Limiter   = (*Driver)(nil)
)

// New returns a Redlock driver over clients, one per independent master.
// An odd number of at least three is the useful choice: N nodes tolerate
// (N−1)/2 failures. Close does not close the clients.
//
// Give the clients ContextTimeoutEnabled: true and MaxRetries: -1. With
// context timeouts a slow node is cut off at the per-node timeout; without
// them the driver stops waiting for it anyway, but the call runs on in the
// background until go-redis's ReadTimeout. Without retries, a script whose
// reply was lost is not run a second time.
func New(clients []redis.UniversalClient, o *Options) (*Driver, error) {
	if len(clients) == 0 {
		return nil, errors.New("redlock: no clients")
	}
	d := &Driver{quorum: len(clients)/2 + 1, prefix: DefaultKeyPrefix}
	if o != nil {
		if o.KeyPrefix != "" {
			d.prefix = o.KeyPrefix
		}
		if o.NodeTimeout < 0 {
			return nil, fmt.Errorf("redlock: invalid NodeTimeout %v: must not be negative", o.NodeTimeout)
		}
		d.nodeTimeout = o.NodeTimeout
	}
	if err := redisscript.CheckPrefix(d.prefix); err != nil {
		return nil, fmt.Errorf("redlock: invalid KeyPrefix: %w", err)
	}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("redlock: client %d is nil", i)
		}
		for _, n := range d.nodes {
			if n.client == c {
				return nil, fmt.Errorf("redlock: client %d is given twice", i)
			}
		}
		d.nodes = append(d.nodes, &node{client: c, hub: redisscript.NewHub(c, d.seen.first)})
	}
	return d, nil
}

// Quorum returns the number of nodes a grant or renewal must reach: N/2+1.
func (d *Driver) Quorum() int { return d.quorum }

func (d *Driver) timeoutFor(ttl time.Duration) time.Duration {
	if d.nodeTimeout > 0 {
		return d.nodeTimeout
	}
	if ttl <= 0 {
		return MaxNodeTimeout
	}
	return max(min(ttl/10, MaxNodeTimeout), time.Millisecond)
}

// drift is Redlock's allowance for clock rate differences: TTL/100 + 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

type result[T any] struct {
	i   int
	v   T
	err error
}

// fanout runs fn on every node in parallel, each bounded by timeout, and
// returns a channel that receives the N results in the order they arrive.
// The calls are tracked, so Close waits for calls their caller stopped
// waiting for.
func fanout[T any](d *Driver, ctx context.Context, timeout time.Duration, fn func(ctx context.Context, n *node) (T, error)) <-chan result[T] {
	return fanoutTo(d, ctx, timeout, nil, fn)
}

// fanoutTo is fanout to the nodes listed (all nodes if which is nil).
func fanoutTo[T any](d *Driver, ctx context.Context, timeout time.Duration, which []int, fn func(ctx context.Context, n *node) (T, error)) <-chan result[T] {
	if which == nil {
		which = make([]int, len(d.nodes))
		for i := range which {
			which[i] = i
		}
	}
	out := make(chan result[T], len(which))
	d.callMu.RLock()
	defer d.callMu.RUnlock()
	if d.stopped {
		for _, i := range which {
			out <- result[T]{i: i, err: errClosed}
		}
		return out
	}
	d.calls.Add(len(which))
	for _, i := range which {
		n := d.nodes[i]
		go func() {
			defer d.calls.Done()
			nctx, cancel := context.WithTimeout(ctx, timeout)
			v, err := fn(nctx, n)
			// A late answer still counts: the caller measures the time
			// spent against the validity itself.
			if err != nil && nctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("no answer within the %v node timeout: %w", timeout, err)
			}
			cancel()
			out <- result[T]{i: i, v: v, err: err}
		}()
	}
	return out
}

var errClosed = errors.New("driver closed")

// dedupeWindow is how long a release message counts as a copy of one
// received from another node with the same channel and token.
const dedupeWindow = time.Second

// dedupe lets one release, published on every node, wake the driver's
// waiters once: it passes the first message per channel and token.
type dedupe struct {
	mu   sync.Mutex
	last map[string]seenMsg
}

type seenMsg struct {
	payload string
	at      time.Time
}

func (dd *dedupe) first(channel, payload string) bool {
	now := time.Now()
	dd.mu.Lock()
	defer dd.mu.Unlock()
	if s, ok := dd.last[channel]; ok && s.payload == payload && now.Sub(s.at) < dedupeWindow {
		return false
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
	dd.last[channel] = seenMsg{payload: payload, at: now}
	return true
}

// stop refuses new node calls and waits for those still running.
func (d *Driver) stop() {
	d.callMu.Lock()
	d.stopped = true
	d.callMu.Unlock()
	d.calls.Wait()
}

// handle is the driver's Grant.Handle.
type handle struct {
	keys redisscript.Keys
}

func (d *Driver) keys(name string, h any) redisscript.Keys {
	if hh, ok := h.(*handle); ok && hh != nil {
		return hh.keys
	}
	return redisscript.KeysFor(d.prefix, name)
}

// TryAcquire runs Redlock's acquire (see the package doc). Grant.TTL is zero:
// the lease is valid for the requested TTL minus the drift, measured from
// when the requests were sent, which is the deadline the dlock package
// keeps; the driver has checked that the acquire itself (fencing write-back
// included) finished inside it.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	start := time.Now()
	validity := req.TTL - drift(req.TTL)
	timeout := d.timeoutFor(req.TTL)
	k := redisscript.KeysFor(d.prefix, req.Name)
	results := fanout(d, ctx, timeout, func(ctx context.Context, n *node) (redisscript.AcquireResult, error) {
		return redisscript.Acquire(ctx, n.client, k, req.Owner, req.TTL, req.LockDelay)
	})
	n := len(d.nodes)
	var (
		got                []result[redisscript.AcquireResult]
		granted, refused   int
		failed             int
		firstErr           error
		maxFence, maxCount uint64
	)
	for len(got) < n {
		r := <-results
		got = append(got, r)
		switch {
		case r.err != nil:
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
		case r.v.Granted:
			granted++
			maxFence = max(maxFence, r.v.Fence)
			maxCount = max(maxCount, uint64(r.v.Count))
		default:
			refused++
			maxFence = max(maxFence, r.v.Fence)
		}
		if granted >= d.quorum || refused+failed > n-d.quorum {
			break
		}
	}
	if granted >= d.quorum {
		err := d.fence(ctx, timeout, k, req.Owner, maxFence, got)
		if err == nil && time.Since(start) >= validity {
			err = fmt.Errorf("acquire took %v, longer than the validity %v (TTL %v minus drift)", time.Since(start).Round(time.Millisecond), validity, req.TTL)
		}
		if err == nil {
			return driver.Grant{Token: maxFence, Count: int(maxCount), Handle: &handle{keys: k}}, nil
		}
		_ = d.undo(ctx, req, k, got, results, timeout, true)
		return driver.Grant{}, wrap(ctx, "acquire", err)
	}
	all := d.undo(ctx, req, k, got, results, timeout, false)
	answered := 0
	for _, r := range all {
		if r.err == nil {
			answered++
		}
	}
	if answered < d.quorum || refused == 0 {
		return driver.Grant{}, wrap(ctx, "acquire", fmt.Errorf("only %d of %d nodes answered, a quorum is %d: %w", answered, n, d.quorum, firstErr))
	}
	return driver.Grant{}, &driver.LockedError{RetryAfter: d.retryAfter(req, all, time.Since(start)), Token: maxFence}
}

// retryAfter estimates when a quorum of nodes could be free: the nodes we
// got are free at once (we released them), refusing nodes when their key
// expires. When the refusals do not come from one owner holding a quorum,
// it was a split vote among contenders who have all released by now (an
// undo publishes nothing, so nobody is woken by it): retry after a random
// delay of one to four times what this attempt took, so that the
// contenders do not collide again.
func (d *Driver) retryAfter(req driver.AcquireRequest, got []result[redisscript.AcquireResult], took time.Duration) time.Duration {
	var free []time.Duration
	holders := map[string]int{}
	for _, r := range got {
		switch {
		case r.err != nil:
		case r.v.Granted:
			free = append(free, 0)
		default:
			free = append(free, r.v.PTTL)
			holders[r.v.Holder]++
		}
	}
	split := true
	for h, c := range holders {
		if c >= d.quorum-(len(d.nodes)-len(got)) && h != req.Owner {
			split = false
		}
	}
	if split {
		took = max(took, 100*time.Microsecond)
		return took + rand.N(3*took)
	}
	if len(free) < d.quorum {
		return 0
	}
	sort.Slice(free, func(i, j int) bool { return free[i] < free[j] })
	return free[d.quorum-1]
}

// fence makes sure a quorum of nodes has a fencing counter of at least
// token before the grant is returned. Granting nodes whose counter is the
// token already count; when they are not a quorum, the token is written
// back to the other nodes that answered and fence waits until enough have
// it. Nodes still busy with the acquire are left alone: a write-back that
// overtook its acquire there would make that node's grant count from the
// token. Lagging nodes get the token in the background either way.
func (d *Driver) fence(ctx context.Context, timeout time.Duration, k redisscript.Keys, owner string, token uint64, got []result[redisscript.AcquireResult]) error {
	have := 0
	var lagging []int
	for _, r := range got {
		switch {
		case r.err != nil:
		case r.v.Granted && r.v.Fence == token:
			have++
		default:
			lagging = append(lagging, r.i)
		}
	}
	if len(lagging) == 0 {
		return nil
	}
	if have >= d.quorum {
		_ = fanoutTo(d, context.WithoutCancel(ctx), timeout, lagging, func(ctx context.Context, n *node) (struct{}, error) {
			return struct{}{}, redisscript.WriteFence(ctx, n.client, k, owner, token)
		})
		return nil
	}
	return d.writeFence(ctx, timeout, k, owner, token, lagging, d.quorum-have)
}

// writeFence raises the fencing counter to token on the nodes listed and
// returns once need of them have it.
func (d *Driver) writeFence(ctx context.Context, timeout time.Duration, k redisscript.Keys, owner string, token uint64, nodes []int, need int) error {
	results := fanoutTo(d, ctx, timeout, nodes, func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, redisscript.WriteFence(ctx, n.client, k, owner, token)
	})
	ok, failed := 0, 0
	var firstErr error
	for ok < need && failed <= len(nodes)-need {
		r := <-results
		if r.err != nil {
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
			continue
		}
		ok++
	}
	if ok < need {
		return fmt.Errorf("fencing token reached %d of %d nodes, a quorum is %d: %w", d.quorum-need+ok, len(d.nodes), d.quorum, firstErr)
	}
	return nil
}

// undo releases a failed acquire on every node that granted it or may have:
// it first waits for the nodes still answering (bounded by the node
// timeout), so that no release overtakes its own acquire. It returns every
// node's result. The releases publish nothing unless publish is set (the
// attempt reached a quorum, so others may have seen it as a holder): a
// failed attempt's partial grants are nobody's release to wait for.
func (d *Driver) undo(ctx context.Context, req driver.AcquireRequest, k redisscript.Keys, got []result[redisscript.AcquireResult], rest <-chan result[redisscript.AcquireResult], timeout time.Duration, publish bool) []result[redisscript.AcquireResult] {
	for len(got) < len(d.nodes) {
		got = append(got, <-rest)
	}
	var which []int
	for _, r := range got {
		if r.err != nil || r.v.Granted {
			which = append(which, r.i)
		}
	}
	if len(which) == 0 {
		return got
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, i := range which {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kk := k
			if !publish {
				kk.Channel = ""
			}
			_, _, _ = redisscript.Release(rctx, d.nodes[i].client, kk, req.Owner, 0)
		}()
	}
	wg.Wait()
	return got
}

// Release releases one hold on every node. It returns the largest hold
// count left on any node, or ErrNotHeld when no node that answered held
// the lock for l.Owner.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	k := d.keys(l.Name, l.Handle)
	type rel struct {
		remaining int
		held      bool
	}
	results := fanout(d, ctx, d.timeoutFor(l.TTL), func(ctx context.Context, n *node) (rel, error) {
		r, held, err := redisscript.Release(ctx, n.client, k, l.Owner, 0)
		return rel{r, held}, err
	})
	remaining, held, notHeld := 0, 0, 0
	var firstErr error
	for range d.nodes {
		r := <-results
		switch {
		case r.err != nil:
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
		case r.v.held:
			held++
			remaining = max(remaining, r.v.remaining)
		default:
			notHeld++
		}
	}
	switch {
	case held > 0:
		return remaining, nil
	case notHeld > len(d.nodes)-d.quorum:
		// Too few nodes can hold it for the lease to be alive.
		return 0, driver.ErrNotHeld
	default:
		return 0, wrap(ctx, "release", fmt.Errorf("released on no node, %d of %d did not answer: %w", len(d.nodes)-notHeld, len(d.nodes), firstErr))
	}
}

// Renew extends every lease on every node, one round trip per node in
// parallel (see redislock for the batching). A lease is renewed when a
// quorum renewed it; it is gone (ErrNotHeld) when more than N − quorum
// nodes no longer hold it; otherwise its fate is unknown.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	items := make([]redisscript.RenewItem, len(ls))
	shortest := ls[0].TTL
	for i, l := range ls {
		items[i] = redisscript.RenewItem{Lock: d.keys(l.Name, l.Handle).Lock, Owner: l.Owner, TTL: l.TTL}
		shortest = min(shortest, l.TTL)
	}
	timeout := max(d.timeoutFor(shortest), shortest/3)
	results := fanout(d, ctx, timeout, func(ctx context.Context, n *node) ([]error, error) {
		return redisscript.Renew(ctx, n.client, items)
	})
	ok := make([]int, len(ls))
	gone := make([]int, len(ls))
	var firstErr error
	undecided := len(ls)
	decided := func(i int) bool { return ok[i] >= d.quorum || gone[i] > len(d.nodes)-d.quorum }
	for answered := 0; answered < len(d.nodes) && undecided > 0; answered++ {
		r := <-results
		if r.err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
			continue
		}
		for i, e := range r.v {
			was := decided(i)
			switch {
			case e == nil:
				ok[i]++
			case errors.Is(e, driver.ErrNotHeld):
				gone[i]++
			default:
				if firstErr == nil {
					firstErr = fmt.Errorf("node %d: %w", r.i, e)
				}
			}
			if !was && decided(i) {
				undecided--
			}
		}
	}
	errs := make([]error, len(ls))
	anyAnswer := false
	for i := range ls {
		switch {
		case ok[i] >= d.quorum:
			anyAnswer = true
		case gone[i] > len(d.nodes)-d.quorum:
			anyAnswer = true
			errs[i] = driver.ErrNotHeld
		default:
			if ok[i] > 0 || gone[i] > 0 {
				anyAnswer = true
			}
			errs[i] = wrap(ctx, "renew", fmt.Errorf("renewed on %d of %d nodes, a quorum is %d: %v", ok[i], len(d.nodes), d.quorum, firstErr))
		}
	}
	if !anyAnswer {
		return nil, wrap(ctx, "renew", fmt.Errorf("no node answered: %w", firstErr))
	}
	return errs, nil
}

// Subscribe registers for release notifications of name on every node,
// over each node's single shared pub/sub connection (see redislock's
// Subscribe). A release publishes its token on every node; the first copy
// to arrive wakes one waiter of this driver, the others are dropped. It
// fails only if no node can be subscribed.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	ch := redisscript.KeysFor(d.prefix, name).Channel
	s := &subscription{sig: make(chan struct{}, 1)}
	var firstErr error
	for i, n := range d.nodes {
		sub, err := n.hub.Subscribe(ctx, ch, s.sig)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", i, err)
			}
			continue
		}
		s.subs = append(s.subs, sub)
	}
	if len(s.subs) == 0 {
		return nil, wrap(ctx, "subscribe", firstErr)
	}
	return s, nil
}

type subscription struct {
	sig  chan struct{}
	subs []*redisscript.Sub
	once sync.Once
}

func (s *subscription) C() <-chan struct{} { return s.sig }

func (s *subscription) Close() error {
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

// Inspect lists the locks whose names start with prefix as a quorum sees
// them: Owner is the owner holding the lock on a quorum of nodes (empty if
// none does), Token the highest counter on any node, ExpiresIn the time
// until fewer than a quorum hold it. Waiters is -1. It fails if fewer than a
// quorum of nodes answer.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	results := fanout(d, ctx, 10*time.Second, func(ctx context.Context, n *node) ([]redisscript.NodeLock, error) {
		return redisscript.Inspect(ctx, n.client, d.prefix, prefix)
	})
	type agg struct {
		info   driver.LockInfo
		owners map[string][]redisscript.NodeLock
	}
	byName := map[string]*agg{}
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
			a := byName[l.Name]
			if a == nil {
				a = &agg{info: driver.LockInfo{Name: l.Name, Waiters: -1}, owners: map[string][]redisscript.NodeLock{}}
				byName[l.Name] = a
			}
			a.info.Token = max(a.info.Token, l.Fence)
			if l.Owner != "" {
				a.owners[l.Owner] = append(a.owners[l.Owner], l)
			}
		}
	}
	if answered < d.quorum {
		return nil, wrap(ctx, "inspect", fmt.Errorf("only %d of %d nodes answered: %w", answered, len(d.nodes), firstErr))
	}
	out := make([]driver.LockInfo, 0, len(byName))
	for _, a := range byName {
		for owner, ls := range a.owners {
			if len(ls) < d.quorum {
				continue
			}
			a.info.Owner = owner
			sort.Slice(ls, func(i, j int) bool { return ls[i].PTTL > ls[j].PTTL })
			a.info.ExpiresIn = ls[d.quorum-1].PTTL
			for _, l := range ls {
				a.info.Count = max(a.info.Count, l.Count)
			}
		}
		out = append(out, a.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Limits reports millisecond TTL granularity (PX).
func (d *Driver) Limits() driver.Limits {
	return driver.Limits{MinTTL: time.Millisecond, TTLGranularity: time.Millisecond}
}

// Close stops the driver's pub/sub connections and waits for node calls
// still running. It closes the go-redis clients only if the driver opened
// them from a URL. Locks still held are left to expire. Close is
// idempotent.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		for _, n := range d.nodes {
			if err := n.hub.Close(); err != nil && d.closeErr == nil {
				d.closeErr = err
			}
		}
		if d.own {
			for _, n := range d.nodes {
				if err := n.client.Close(); err != nil && d.closeErr == nil {
					d.closeErr = err
				}
			}
		}
		d.stop()
	})
	return d.closeErr
}

// kill drops every connection at once without releasing anything, as a
// crashed process would. For tests.
func (d *Driver) kill() {
	for _, n := range d.nodes {
		_ = n.hub.Close()
		_ = n.client.Close()
	}
	d.stop()
}

// wrap adds the operation to err, and makes sure an error caused by ctx
// wraps ctx.Err().
func wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("redlock: %s: %w (%v)", op, cerr, err)
	}
	return fmt.Errorf("redlock: %s: %w", op, err)
}
