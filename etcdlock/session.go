package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock"
)

// session is one etcd lease. Its Session records the send time of the last
// confirmed grant or keepalive, and ends when the lease is gone.
type session struct {
	*sessionlock.Session
	id   clientv3.LeaseID
	want int64         // the TTL asked for, in seconds
	ttl  time.Duration // the TTL the server granted (it raises one below its minimum)

	prefixLen int // the length of the driver's Options.Prefix (see handle.name)

	mu     sync.Mutex                 // guards delays, grants and the handles' fields marked so
	delays map[int64]clientv3.LeaseID // lock-delay leases by TTL in seconds (see delay.go)
	grants map[uint64]*handle         // the handles whose slots are in use, by slotHash (see slots.go)
	dmu    sync.Mutex                 // serialises grants of delay leases

	kmu  sync.Mutex    // guards next
	next *round        // the keepalive Renew calls wait for; nil when none asked
	kick chan struct{} // capacity 1: tells the keepalive loop that next is waiting
}

// leaseSeconds is the lease TTL, in whole seconds (rounded up), of a request
// for ttl.
func (d *Driver) leaseSeconds(ttl time.Duration) (int64, error) {
	switch {
	case ttl < 0:
		return 0, fmt.Errorf("etcdlock: TTL %v is negative", ttl)
	case ttl == 0:
		return d.ttlSeconds, nil
	case ttl > maxLeaseTTL:
		return 0, fmt.Errorf("etcdlock: TTL %v is above etcd's maximum lease TTL %v", ttl, maxLeaseTTL)
	}
	return seconds(ttl), nil
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// maxLeaseTTL is etcd's maximum lease TTL.
const maxLeaseTTL = 9_000_000_000 * time.Second

// session returns the live lease for a TTL of secs whole seconds, granting
// one if there is none.
func (d *Driver) session(ctx context.Context, secs int64) (*session, error) {
	d.smu.Lock()
	defer d.smu.Unlock()
	if s := d.sessions[secs]; s != nil && !s.Lost() {
		return s, nil
	}
	if err := d.ctx.Err(); err != nil {
		return nil, errors.New("etcdlock: driver is closed")
	}
	sent := time.Now()
	resp, err := d.cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: grant lease of %ds: %w", secs, err)
	}
	if resp.TTL <= 0 {
		// Not an etcd server's answer; revoke it rather than guess.
		rctx, cancel := context.WithTimeout(d.ctx, cleanupTimeout)
		_, _ = d.cli.Revoke(rctx, resp.ID)
		cancel()
		return nil, fmt.Errorf("etcdlock: grant lease of %ds: the server granted a TTL of %ds", secs, resp.TTL)
	}
	// The server may have raised the TTL to its minimum: every validity is
	// computed from the TTL it granted.
	s := &session{Session: sessionlock.NewSession(sent), id: resp.ID, want: secs, ttl: time.Duration(resp.TTL) * time.Second, kick: make(chan struct{}, 1), prefixLen: len(d.prefix)}
	if !d.bg.Go(func() { d.keepAlive(s) }) {
		// Closed meanwhile: Close may have revoked the leases already.
		rctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		_, _ = d.cli.Revoke(rctx, resp.ID)
		cancel()
		return nil, errors.New("etcdlock: driver is closed")
	}
	if d.sessions == nil {
		d.sessions = map[int64]*session{}
	}
	d.sessions[secs] = s
	return s, nil
}

// liveSessions lists the latest lease of each TTL (one may have ended).
func (d *Driver) liveSessions() []*session {
	d.smu.Lock()
	defer d.smu.Unlock()
	ss := make([]*session, 0, len(d.sessions))
	for _, s := range d.sessions {
		ss = append(ss, s)
	}
	return ss
}

// keepAlive is s's one keepalive loop: every keepalive of s's leases is sent
// here, with KeepAliveOnce, whether the loop's own timer or a Renew asked for
// it (see keepAliveNow). It records the send time of each confirmed
// keepalive, and ends s when the server no longer knows the lease or no
// keepalive has been confirmed for a whole TTL (measured from the send time
// of the last confirmed one, so the driver gives up no later than the server
// does). It replaces the client library's KeepAlive, whose deadline is
// measured from when a reply arrives.
//
// Left to itself the loop sends a keepalive every TTL/3. After a keepalive
// that a Renew asked for it waits TTL/3+TTL/12: the dlock package renews
// every TTL/3 and will ask again before then, so a renewed lease costs one
// keepalive per renewal, not two, and a lease whose renewals stop is still
// refreshed well within its TTL.
func (d *Driver) keepAlive(s *session) {
	idle := s.ttl / 3
	retry := min(idle, 200*time.Millisecond)
	timer := time.NewTimer(idle)
	defer timer.Stop()
	end := func(format string, args ...any) {
		s.End(fmt.Errorf("etcdlock: lease %x: %s: %w", int64(s.id), fmt.Sprintf(format, args...), driver.ErrSessionLost))
	}
	for {
		kicked := false
		select {
		case <-d.ctx.Done():
			end("driver closed")
			return
		case <-timer.C:
		case <-s.kick:
			kicked = true
		}
		s.kmu.Lock()
		r := s.next
		s.next = nil
		s.kmu.Unlock()
		if kicked && r == nil {
			continue // the round asked for went out with a timer tick
		}
		left := time.Until(s.RefreshedAt().Add(s.ttl))
		if left <= 0 {
			end("no keepalive confirmed within its TTL %v", s.ttl)
			return // r's waiters see s end
		}
		ctx, cancel := context.WithTimeout(d.ctx, left)
		ctx = rpcCtx(ctx)
		err := d.refresh(ctx, s)
		if r != nil {
			r.err = err
			close(r.done)
		}
		if err == nil {
			d.reap(ctx, s)
		}
		cancel()
		next := idle
		if r != nil {
			// A Renew asked: the dlock package will ask again one renewal
			// interval (TTL/3) after it sent this one, so wait a little
			// longer (TTL/12) before sending one unasked.
			next = idle + s.ttl/12
		}
		switch {
		case err == nil:
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			end("expired or revoked")
			return
		default:
			next = retry // unknown: try again soon, until the TTL runs out
		}
		timer.Reset(next)
	}
}

// round is one keepalive of a session's leases that Renew calls asked for.
// Every Renew that asks before the loop takes the round shares it, and the
// loop sends its keepalive only after taking it: so the keepalive was sent
// after each of those Renew calls began, and a validity the dlock package
// counts from its Renew call is never overstated.
type round struct {
	done chan struct{}
	err  error // set before done closes
}

// keepAliveNow asks s's keepalive loop for a keepalive of s's leases sent
// after this call, and returns its outcome: nil once the server confirmed
// it, an error wrapping rpctypes.ErrLeaseNotFound or driver.ErrSessionLost
// when the lease is gone, or another error when its fate is unknown
// (ctx.Err() when ctx ended first).
func (d *Driver) keepAliveNow(ctx context.Context, s *session) error {
	s.kmu.Lock()
	r := s.next
	if r == nil {
		r = &round{done: make(chan struct{})}
		s.next = r
	}
	s.kmu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default: // a kick is pending already
	}
	select {
	case <-r.done:
		return r.err
	case <-s.Done():
		return s.Cause()
	case <-ctx.Done():
		return ctx.Err()
	case <-d.ctx.Done():
		return errors.New("etcdlock: driver is closed")
	}
}

// refresh keeps s's delay leases alive and then, only if that worked, s's
// lease, and records the send time of the latter. A delay lease the server
// no longer knows (someone revoked it) is forgotten: later guards get a new
// one.
func (d *Driver) refresh(ctx context.Context, s *session) error {
	s.mu.Lock()
	delays := make(map[int64]clientv3.LeaseID, len(s.delays))
	for k, v := range s.delays {
		delays[k] = v
	}
	s.mu.Unlock()
	if len(delays) > 0 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failed error
		for secs, id := range delays {
			wg.Go(func() {
				_, err := d.cli.KeepAliveOnce(ctx, id)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
				case errors.Is(err, rpctypes.ErrLeaseNotFound):
					s.mu.Lock()
					if s.delays[secs] == id {
						delete(s.delays, secs)
					}
					s.mu.Unlock()
				default:
					failed = err
				}
			})
		}
		wg.Wait()
		if failed != nil {
			return fmt.Errorf("keep lock-delay lease alive: %w", failed)
		}
	}
	sent := time.Now()
	resp, err := d.cli.KeepAliveOnce(ctx, s.id)
	if err != nil {
		return err
	}
	if resp.TTL <= 0 {
		return rpctypes.ErrLeaseNotFound
	}
	s.Refresh(sent)
	return nil
}
