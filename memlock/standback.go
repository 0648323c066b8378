package memlock

import (
	"context"
	"errors"
	"time"

	"github.com/dlock/dlock/driver"
)

// Stand-back after a contended release. A release wakes every subscriber
// of the name, and a goroutine that releases and loops straight back into
// Lock asks again before any woken waiter has been scheduled: with 9
// contenders the releaser took the lock again 83% of the time, and some
// waiters waited 4.7 s. So a Driver that releases a mutex while the
// Backend has subscribers for it holds its next attempts on that name back
// for up to yieldFor, or until another grant of it (a TryLock is only
// delayed, never refused for it), unless the attempt is a waiting Lock the Backend refused before: such a
// retry answers the wake-up, and may be the waiter the release woke. The
// stand-back ends at the Driver's next grant of the name.

// yieldFor is how long a contended release leaves the lock to the waiters
// it woke.
const yieldFor = 2 * time.Millisecond

// maxStandBack bounds the names and refused waiters a Driver remembers;
// past it both are forgotten (a stand-back is skipped, a retry may stand
// back once).
const maxStandBack = 4096

// waitKey is req's entry in Driver.waiting.
func waitKey(name, owner string) string { return name + "\x00" + owner }

// standBack delays req while d stands back from its name: at most
// yieldFor, until the name's next grant (the waiter took it; the attempt
// is then refused and waits for its own turn), never past ctx.
func (d *Driver) standBack(ctx context.Context, req driver.AcquireRequest) error {
	if req.Kind != driver.Exclusive {
		return nil
	}
	d.mu.Lock()
	until, ok := d.yields[req.Name]
	_, exempt := d.waiting[waitKey(req.Name, req.Owner)]
	d.mu.Unlock()
	left := time.Until(until)
	if !ok || exempt || left <= 0 {
		return nil
	}
	granted := d.b.nextGrant(req.Name)
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
	case <-granted:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// acquired records the outcome of req's attempt for the stand-back.
func (d *Driver) acquired(req driver.AcquireRequest, g driver.Grant, err error) {
	if req.Kind != driver.Exclusive {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err == nil && g.Count == 1:
		delete(d.yields, req.Name)
		delete(d.waiting, waitKey(req.Name, req.Owner))
	case err != nil && req.Waiting && errors.Is(err, driver.ErrLocked):
		if d.waiting == nil || len(d.waiting) >= maxStandBack {
			d.waiting = map[string]struct{}{}
		}
		d.waiting[waitKey(req.Name, req.Owner)] = struct{}{}
	}
}

// releasedContended makes d stand back from name after its last release
// of it, which found subscribers waiting.
func (d *Driver) releasedContended(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.yields == nil || len(d.yields) >= maxStandBack {
		d.yields = map[string]time.Time{}
	}
	d.yields[name] = time.Now().Add(yieldFor)
}
