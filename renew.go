package dlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/dlock/dlock/driver"
)

// The schedule of a Client's leases lives in three binary min-heaps, guarded
// by Client.mu, so that no work done per grant, per release or per tick walks
// every lease the client holds:
//
//   - byRenew orders the auto-renewing leases by when they fall due;
//   - byEarly orders the same leases by when they may join a batch (due time
//     minus half their interval);
//   - byDeadline orders every lease by its local validity deadline.
//
// Each lease knows its position in each heap, so adding, moving and removing
// it costs O(log n). The byDeadline key is the lease's validUntil itself
// (written under Client.mu as well as Lease.mu), and a lease stays in that
// heap from register to unregister, so the heap also lists every lease the
// Client holds (for Close). The renewer goroutine sleeps until the head of byRenew
// falls due and then takes, from byEarly, every lease that may join the
// batch; the reaper goroutine sleeps until the head of byDeadline passes and
// ends the leases whose deadline did. A grant wakes either goroutine only
// when it becomes the earliest of its heap.
const (
	byRenew = iota
	byEarly
	byDeadline
	nHeaps
)

// idle is the armed time of a goroutine with nothing scheduled: it sleeps
// until poked.
const idle = math.MaxInt64

// schedBatch bounds the leases moved in or out of the heaps under one hold of
// Client.mu, so that a tick renewing many leases does not stall every Lock
// and Unlock for its whole length.
const schedBatch = 256

// leaseHeap is a min-heap of leases on their key k (Lease.keys[k], or
// Lease.validUntil for byDeadline); each lease keeps its position in
// Lease.pos[k], -1 when absent.
type leaseHeap struct {
	k  int
	ls []*Lease
}

// key returns l's key in h.
func (h *leaseHeap) key(l *Lease) int64 {
	if h.k == byDeadline {
		return l.validUntil
	}
	return l.keys[h.k]
}

func (h *leaseHeap) less(i, j int) bool { return h.key(h.ls[i]) < h.key(h.ls[j]) }

func (h *leaseHeap) swap(i, j int) {
	h.ls[i], h.ls[j] = h.ls[j], h.ls[i]
	h.ls[i].pos[h.k] = int32(i)
	h.ls[j].pos[h.k] = int32(j)
}

func (h *leaseHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down moves the lease at i down to its place; it reports whether it moved.
func (h *leaseHeap) down(i int) bool {
	i0 := i
	n := len(h.ls)
	for {
		m := i
		if l := 2*i + 1; l < n && h.less(l, m) {
			m = l
		}
		if r := 2*i + 2; r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			return i != i0
		}
		h.swap(i, m)
		i = m
	}
}

// set gives l the key at in a renewal heap, adding l or moving it.
func (h *leaseHeap) set(l *Lease, at int64) {
	l.keys[h.k] = at
	h.fix(l)
}

// fix adds l to the heap, or moves it to its place after its key changed.
func (h *leaseHeap) fix(l *Lease) {
	i := int(l.pos[h.k])
	if i < 0 {
		l.pos[h.k] = int32(len(h.ls))
		h.ls = append(h.ls, l)
		h.up(len(h.ls) - 1)
		return
	}
	if !h.down(i) {
		h.up(i)
	}
}

// remove takes l out of the heap if it is there.
func (h *leaseHeap) remove(l *Lease) {
	i := int(l.pos[h.k])
	if i < 0 {
		return
	}
	last := len(h.ls) - 1
	if i != last {
		h.swap(i, last)
	}
	h.ls[last] = nil
	h.ls = h.ls[:last]
	l.pos[h.k] = -1
	if i != last {
		h.down(i)
		h.up(i)
	}
	if cap(h.ls) > 64 && len(h.ls) < cap(h.ls)/4 {
		// Give back the memory of a burst of leases once it has passed.
		h.ls = append([]*Lease(nil), h.ls...)
	}
}

// head returns the lease with the least key, nil if the heap is empty.
func (h *leaseHeap) head() *Lease {
	if len(h.ls) == 0 {
		return nil
	}
	return h.ls[0]
}

// sleeper is a goroutine of the Client that sleeps until a time on the
// Client's clock or a poke.
type sleeper struct {
	wake  chan struct{}
	stop  <-chan struct{} // closed when the goroutine is to return
	armed int64           // Client.mu: when it wakes next on its own; idle if never
}

func newSleeper(stop <-chan struct{}) sleeper {
	return sleeper{wake: make(chan struct{}, 1), stop: stop, armed: idle}
}

// wakeByLocked makes s wake by at (Client.mu held): it pokes s only if s
// would otherwise sleep past at.
func (s *sleeper) wakeByLocked(at int64) {
	if at >= s.armed {
		return
	}
	s.armed = at
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// sleep waits until at (idle: until poked) or a poke; false once s.stop
// is closed.
func (s *sleeper) sleep(c *Client, timer *time.Timer, at int64) bool {
	if at == idle {
		timer.Stop()
	} else {
		// Since Go 1.23 Reset discards a value the timer sent before: no
		// drain needed.
		timer.Reset(max(time.Duration(at-c.now()), 0))
	}
	select {
	case <-s.stop:
		return false
	case <-s.wake:
	case <-timer.C:
	}
	return true
}

// now reads the Client's clock: nanoseconds since the Client was made, on
// the monotonic clock.
func (c *Client) now() int64 { return int64(time.Since(c.epoch)) }

// at converts t to the Client's clock.
func (c *Client) at(t time.Time) int64 { return int64(t.Sub(c.epoch)) }

// scheduleRenewLocked files l for renewal at at (Client.mu held, and l.mu
// unless l is not yet registered, so no one else can reach it).
func (c *Client) scheduleRenewLocked(l *Lease, at int64) {
	c.heaps[byRenew].set(l, at)
	c.heaps[byEarly].set(l, at-int64(l.renewEveryLocked()/2))
	c.renewer.wakeByLocked(at)
}

// scheduleDeadlineLocked files l for loss at its validUntil (Client.mu held,
// and l.mu unless l is not yet registered), once it is added or has
// changed.
func (c *Client) scheduleDeadlineLocked(l *Lease) {
	c.heaps[byDeadline].fix(l)
	c.reaper.wakeByLocked(l.validUntil)
}

// unscheduleRenewLocked takes l out of the renewal heaps (Client.mu held).
func (c *Client) unscheduleRenewLocked(l *Lease) {
	c.heaps[byRenew].remove(l)
	c.heaps[byEarly].remove(l)
}

// renewalLocked files l for renewal at at (l.mu held), unless it has ended,
// is being released or does not renew automatically.
func (l *Lease) renewalLocked(at int64) {
	if l.state != stateLive || l.flags&autoRenew == 0 {
		return
	}
	l.c.mu.Lock()
	if l.registered {
		l.c.scheduleRenewLocked(l, at)
	}
	l.c.mu.Unlock()
}

// nextKey returns the least key of the heap, idle if it is empty.
func (h *leaseHeap) nextKey() int64 {
	if len(h.ls) == 0 {
		return idle
	}
	return h.key(h.ls[0])
}

// runSleeper runs one of c's scheduling goroutines until c closes: take
// returns the leases whose time has come, which handle serves, or else when
// to look again (having armed s for it under Client.mu).
func (c *Client) runSleeper(s *sleeper, take func(now int64) (int64, []*Lease), handle func([]*Lease)) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		next, ls := take(c.now())
		if len(ls) > 0 {
			handle(ls)
			continue
		}
		if !s.sleep(c, timer, next) {
			return
		}
	}
}

// runRenewer renews every auto-renewing lease of c. On each tick it sends
// one driver.Renew call covering every lease that is due, or due within half
// its interval, so leases taken at different times fall into step and K
// leases cost one round trip per tick rather than K.
func (c *Client) runRenewer() { c.runSleeper(&c.renewer, c.dueLeases, c.renewBatch) }

// dueLeases takes out of the renewal heaps the leases to renew now, or
// returns when the next one falls due (idle if none; the renewer is armed for
// it). When at least one lease is due, every lease due within half its
// interval joins the batch.
func (c *Client) dueLeases(now int64) (next int64, batch []*Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if next = c.heaps[byRenew].nextKey(); next > now {
		c.renewer.armed = next
		return next, nil
	}
	for {
		for range schedBatch {
			l := c.heaps[byEarly].head()
			if l == nil || l.keys[byEarly] > now {
				return 0, batch
			}
			c.unscheduleRenewLocked(l)
			batch = append(batch, l)
		}
		c.mu.Unlock()
		c.mu.Lock()
	}
}

func (c *Client) renewBatch(batch []*Lease) {
	now := time.Now()
	ls := make([]driver.Lease, 0, len(batch))
	live := batch[:0]
	deadline := c.at(now.Add(time.Hour))
	for _, l := range batch {
		l.mu.Lock()
		if l.state == stateLive {
			ls = append(ls, l.driverLeaseLocked())
			live = append(live, l)
			deadline = min(deadline, l.validUntil)
		}
		l.mu.Unlock()
	}
	if len(live) == 0 {
		return
	}
	// Nothing is gained by waiting for a reply past the earliest validity
	// deadline of the batch; the reaper ends those leases then anyway.
	timeout := max(time.Duration(deadline-c.at(now)), 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(c.closeCtx, timeout)
	// A call that hangs (a paused server, a partition that drops packets)
	// fails only at the batch's earliest deadline, when the leases are lost
	// anyway: warn while they can still be saved.
	slow := c.warnUnanswered(live, timeout)
	sent := time.Now()
	errs, err := c.d.Renew(ctx, ls)
	latency := time.Since(sent)
	cancel()
	if slow != nil {
		slow.Stop()
	}
	if err == nil && len(errs) != len(ls) {
		err = fmt.Errorf("driver returned %d results for %d leases", len(errs), len(ls))
	}
	for i, l := range live {
		e := err
		if e == nil {
			e = errs[i]
		}
		var r RenewalInfo
		var info LeaseInfo
		switch {
		case e == nil:
			l.mu.Lock()
			l.confirmedLocked(sent)
			if l.x != nil {
				l.x.renewFails = 0
			}
			if c.hooks != nil {
				r = RenewalInfo{Outcome: OutcomeOK, ValidFor: l.validForLocked()}
				info = c.leaseInfo(l, l.ttl)
			}
			l.mu.Unlock()
		case gone(e):
			if c.hooks != nil {
				l.mu.Lock()
				r = RenewalInfo{Outcome: OutcomeLost, Err: e, Latency: latency, Failures: l.renewFailsLocked() + 1,
					ValidFor: l.validForLocked(), Batch: len(live), Index: i}
				info = c.leaseInfo(l, l.ttl)
				l.mu.Unlock()
				c.hooks.Renewal(info, r)
			}
			l.lose(e)
			continue
		default:
			// Fate unknown: try again soon, but never past the validity
			// deadline, which the reaper enforces on its own.
			l.mu.Lock()
			t := c.now()
			retry := min(l.renewEveryLocked()/4, max(time.Duration(l.validUntil-t)/3, time.Millisecond))
			l.renewalLocked(t + int64(max(retry, time.Millisecond)))
			if x := l.extraLocked(); x.renewFails < math.MaxUint16 {
				x.renewFails++
			}
			fails, left := l.renewFailsLocked(), l.validForLocked()
			if c.hooks != nil {
				r = RenewalInfo{Outcome: OutcomeError, Err: e, Failures: int(fails), ValidFor: left}
				info = c.leaseInfo(l, l.ttl)
			}
			l.mu.Unlock()
			c.log.Warn("dlock: renewal failed, will retry until the lease's validity deadline", "backend", c.backend,
				"name", l.name, "kind", l.kind.String(), "token", l.token, "attempt", int(fails), "valid_for", left, "err", e)
		}
		if c.hooks != nil {
			r.Latency, r.Batch, r.Index = latency, len(live), i
			c.hooks.Renewal(info, r)
		}
	}
}

// renewFailsLocked counts the automatic renewals of l that failed in a row
// (l.mu held).
func (l *Lease) renewFailsLocked() int {
	if l.x == nil {
		return 0
	}
	return int(l.x.renewFails)
}

// validForLocked is ValidFor with l.mu held.
func (l *Lease) validForLocked() time.Duration {
	if l.state == stateEnded {
		return 0
	}
	return max(time.Duration(l.validUntil-l.c.now()), 0)
}

// warnUnanswered arranges for a Warn record per lease of a renewal batch
// whose call is still unanswered after the leases' renewal interval (at
// most half the call's timeout, which ends at the batch's earliest validity
// deadline); the caller stops the timer it returns when the call returns.
// Nothing is arranged when the logger does not record warnings.
func (c *Client) warnUnanswered(live []*Lease, timeout time.Duration) *time.Timer {
	if !c.log.Enabled(context.Background(), slog.LevelWarn) {
		return nil
	}
	after := timeout / 2
	for _, l := range live {
		l.mu.Lock()
		after = min(after, l.renewEveryLocked())
		l.mu.Unlock()
	}
	start := time.Now()
	return time.AfterFunc(after, func() {
		waited := time.Since(start).Round(time.Millisecond)
		for _, l := range live {
			l.mu.Lock()
			ended, fails, left := l.state == stateEnded, l.renewFailsLocked(), l.validForLocked()
			l.mu.Unlock()
			if ended {
				continue
			}
			c.log.Warn("dlock: renewal not answered yet; the lease is lost at its validity deadline unless it gets through",
				"backend", c.backend, "name", l.name, "kind", l.kind.String(), "token", l.token,
				"attempt", int(fails)+1, "waited", waited, "valid_for", left)
		}
	})
}

// runReaper ends the leases whose local validity deadline passes before
// renewal confirmed them.
func (c *Client) runReaper() {
	c.runSleeper(&c.reaper, c.expiredLeases, func(expired []*Lease) {
		for _, l := range expired {
			l.deadlinePassed()
		}
	})
}

// expiredLeases returns up to schedBatch leases whose deadline is not after
// now, or when the next deadline falls (idle if none; the reaper is armed for
// it). The leases stay in the heap: deadlinePassed ends them, which takes
// them out, unless a renewal extended them meanwhile, which moved them.
func (c *Client) expiredLeases(now int64) (next int64, expired []*Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.heaps[byDeadline]
	// The expired leases are a subtree at the top of the heap.
	var stack [64]int
	todo := append(stack[:0], 0)
	for len(todo) > 0 && len(expired) < schedBatch {
		i := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if i >= len(h.ls) || h.ls[i].validUntil > now {
			continue
		}
		expired = append(expired, h.ls[i])
		todo = append(todo, 2*i+2, 2*i+1)
	}
	if len(expired) > 0 {
		return 0, expired
	}
	next = h.nextKey()
	c.reaper.armed = next
	return next, nil
}

// deadlinePassed ends l with ErrLeaseLost, the reaper having found its
// deadline passed, unless a renewal extended it meanwhile (which moved it in
// the deadline heap).
func (l *Lease) deadlinePassed() {
	l.mu.Lock()
	if l.state == stateEnded || l.validUntil > l.c.now() {
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.lose(errDeadlinePassed)
}

var errDeadlinePassed = errors.New("validity deadline passed before renewal confirmed the lease")
