package dlock

import (
	"context"
	"time"

	"github.com/dlock/dlock/driver"
)

// releaseRetry is a Release whose outcome was unknown (the request failed
// with an error other than ErrNotHeld: a lost reply, a connection cut, a
// timeout). The lock may still be held on the server by an owner that gave it
// up, so the Client keeps trying in the background until the release is
// confirmed (nil or ErrNotHeld), the grant's session ends (lost closes), the
// grant has certainly expired on the server (until, for TTL-bound grants), or
// the Client closes (Close makes one last attempt).
type releaseRetry struct {
	op    string // "unlock", "clean-up", "late grant": for logs
	dl    driver.Lease
	lost  <-chan struct{} // the grant's session; nil when TTL-bound
	until time.Time       // zero when bound to a session instead of a TTL
}

// releaseRetryMaxFloor is the least cap of the backoff between background
// release attempts (WaitMin doubling to WaitMax, but at least this), so that
// a backend that keeps failing is not hammered, nor the log flooded, when
// WaitMax is very short.
const releaseRetryMaxFloor = time.Second

// releaseUnknown hands a release whose outcome is unknown to the background
// retrier. generated says whether dl.Owner was generated for this one grant:
// only then is a retry safe, since an explicit owner may hold the lock more
// than once (re-entrance) and a retry of a release that did take effect would
// give up another hold of the same owner. lost is the grant's session channel
// (nil if none); a TTL-bound grant is retried until its TTL, lock-delay and
// the release timeout have certainly run out on the server.
func (c *Client) releaseUnknown(op string, dl driver.Lease, lost <-chan struct{}, generated bool, err error) {
	if !generated {
		c.log.Warn("dlock: release failed and is not retried, since the owner is explicit (a retry could give up another hold of the same owner); the lock is freed when its TTL or session ends",
			"backend", c.backend, "op", op, "name", dl.Name, "err", err)
		return
	}
	p := &releaseRetry{op: op, dl: dl, lost: lost}
	if lost == nil {
		// Every request that could extend the grant was sent before now;
		// one that is still in flight is bounded by the release timeout.
		p.until = time.Now().Add(dl.TTL + dl.LockDelay + defaultDrift(dl.TTL) + c.opts.ReleaseTimeout)
	}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		c.log.Warn("dlock: release failed while the client closes; the lock is freed when its TTL or session ends",
			"backend", c.backend, "op", op, "name", dl.Name, "err", err)
		return
	}
	c.retries[p] = struct{}{}
	c.retryWG.Add(1)
	c.mu.Unlock()
	c.log.Warn("dlock: release failed, retrying in the background", "backend", c.backend, "op", op, "name", dl.Name, "err", err)
	go c.runRetry(p)
}

// runRetry retries one release with jittered exponential backoff.
func (c *Client) runRetry(p *releaseRetry) {
	defer c.retryWG.Done()
	bo := newBackoff(c.opts.WaitMin, max(c.opts.WaitMax, releaseRetryMaxFloor))
	done := func(msg string, args ...any) {
		c.mu.Lock()
		delete(c.retries, p)
		c.mu.Unlock()
		c.log.Info(msg, append([]any{"backend", c.backend}, args...)...)
	}
	for {
		d := bo.next()
		if !p.until.IsZero() {
			left := time.Until(p.until)
			if left <= 0 {
				c.mu.Lock()
				delete(c.retries, p)
				c.mu.Unlock()
				c.log.Warn("dlock: background release gave up: the lease has expired on the server by now",
					"backend", c.backend, "op", p.op, "name", p.dl.Name)
				return
			}
			d = min(d, left)
		}
		t := time.NewTimer(d)
		select {
		case <-c.closing:
			t.Stop()
			return // Close makes the last attempt
		case <-p.lost:
			t.Stop()
			done("dlock: background release ended: the grant's session is gone", "op", p.op, "name", p.dl.Name)
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.closeCtx, c.opts.ReleaseTimeout)
		_, err := c.d.Release(ctx, p.dl)
		cancel()
		switch {
		case err == nil:
			done("dlock: background release succeeded", "op", p.op, "name", p.dl.Name)
			return
		case gone(err):
			done("dlock: background release: the lock is no longer held", "op", p.op, "name", p.dl.Name)
			return
		case c.closeCtx.Err() != nil:
			return // Close makes the last attempt
		}
		c.log.Warn("dlock: background release failed, will retry", "backend", c.backend, "op", p.op, "name", p.dl.Name, "err", err)
	}
}
