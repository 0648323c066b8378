// Package standback holds a driver's new attempts on a mutex back for a
// moment after it released that mutex to waiters, so that the waiter the
// release woke takes the lock rather than the releaser looping back into
// Lock. The SQL drivers and memlock use it; each decides when a release
// woke waiters.
package standback

import (
	"context"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
)

// StandBack holds a driver's new attempts on a mutex back for a moment
// after it released that mutex to waiters. A lease row, GET_LOCK or a row
// lock goes to whoever asks first once it is free, and a releaser looping
// straight back into Lock asks within microseconds, while the waiter its
// release woke needs a wake-up and a round trip: so after such a release
// (the driver decides when: see Released) the driver's next attempts on
// the name wait up to For before they ask the server, leaving the
// lock to the woken waiter; the attempt is then made as usual (a TryLock
// is delayed, never refused for it). A waiting Lock the server already
// refused is exempt (AcquireRequest.Waiting, the same name and owner): its
// next attempt answers the wake-up, and may be the very waiter the release
// woke, a goroutine of the same driver. The stand-back ends at the
// driver's next grant of the name. Nothing is stored or sent for it. All
// methods are safe for concurrent use.
type StandBack struct {
	mu     sync.Mutex
	yields map[string]yield // stand-backs since a release, until the next grant
	// waiting lists the waiting Locks (name and owner) the server refused,
	// until their grant.
	waiting map[string]struct{}
	// TestHook, set only by tests before first use, runs when an attempt
	// starts to stand back.
	TestHook func()
}

// For is how long a release to waiters leaves the lock to them: a woken
// waiter needs about a millisecond to make its grant statement.
const For = 2 * time.Millisecond

// maxKept bounds the names and refused waiters a StandBack remembers;
// past it both are forgotten (a stand-back is skipped, a retry may stand
// back once: Locks that gave up are never told to the driver).
const maxKept = 4096

type yield struct {
	until time.Time
	token uint64 // of the release that started it
}

// New returns a StandBack with no stand-back under way.
func New() *StandBack {
	return &StandBack{yields: map[string]yield{}, waiting: map[string]struct{}{}}
}

func waitKey(req driver.AcquireRequest) string { return req.Name + "\x00" + req.Owner }

// Refused records that the server refused req: a waiting Lock's later
// attempts are exempt from standing back.
func (s *StandBack) Refused(req driver.AcquireRequest) {
	if !req.Waiting || req.Kind != driver.Exclusive {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) >= maxKept {
		clear(s.waiting)
	}
	s.waiting[waitKey(req)] = struct{}{}
}

// Released starts a stand-back from name after the release of its grant
// with token, to be called when the release is known or thought to have
// woken waiters.
func (s *StandBack) Released(name string, token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.yields) >= maxKept {
		clear(s.yields)
	}
	s.yields[name] = yield{until: time.Now().Add(For), token: token}
}

// Granted records a new grant (hold count 1) of req with token: it ends
// the stand-back from its name and req's exemption. It reports whether the
// grant came right after the release that started the stand-back (token
// follows that release's: nobody else was granted the lock in between, so
// nobody was waiting for it).
func (s *StandBack) Granted(req driver.AcquireRequest, token uint64) (alone bool) {
	if req.Kind != driver.Exclusive {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Waiting && len(s.waiting) > 0 {
		delete(s.waiting, waitKey(req))
	}
	y, ok := s.yields[req.Name]
	if !ok {
		return false
	}
	delete(s.yields, req.Name)
	return token == y.token+1
}

// Exempt reports whether req is a waiting Lock's attempt after the server
// refused it (see Refused): such an attempt never stands back.
func (s *StandBack) Exempt(req driver.AcquireRequest) bool {
	if !req.Waiting || req.Kind != driver.Exclusive {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) == 0 {
		return false
	}
	_, ok := s.waiting[waitKey(req)]
	return ok
}

// Wait delays req while the driver stands back from its name: at most
// For after the release, until the channel next returns closes (nil: no
// such end; a driver that sees the next grant passes one, so the attempt
// is made, and refused, as soon as the woken waiter holds the lock), and
// never past ctx, whose error it returns if ctx ended meanwhile. next is
// called only when req stands back, with the token of the release that
// started the stand-back; it must return a closed channel when the name
// was granted since that release (the woken waiter may have been granted
// between Wait's look at the stand-back and the call). Other kinds and
// exempt waiters go at once.
func (s *StandBack) Wait(ctx context.Context, req driver.AcquireRequest, next func(released uint64) <-chan struct{}) error {
	if req.Kind != driver.Exclusive {
		return nil
	}
	// The uncontended path (no stand-back under way, nobody refused) looks
	// up the name alone: the key of a waiter costs an allocation.
	s.mu.Lock()
	y, ok := s.yields[req.Name]
	exempt := false
	if ok && req.Waiting && len(s.waiting) > 0 {
		_, exempt = s.waiting[waitKey(req)]
	}
	s.mu.Unlock()
	if !ok || exempt {
		return nil
	}
	left := time.Until(y.until)
	if left <= 0 {
		return nil
	}
	if s.TestHook != nil {
		s.TestHook()
	}
	var granted <-chan struct{}
	if next != nil {
		granted = next(y.token)
	}
	return Delay(ctx, left, granted)
}

// Delay waits for d, or until granted is closed (nil: never), whichever
// comes first; it returns ctx's error if ctx ends first. It is the wait of
// a stand-back, for drivers that decide when to stand back themselves.
func Delay(ctx context.Context, d time.Duration, granted <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-granted:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
