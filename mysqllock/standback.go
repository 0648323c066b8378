package mysqllock

import (
	"context"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
)

// Stand-back after a contended release. GET_LOCK, a row lock and a free
// lease row are granted to whoever asks first, and a releaser looping
// straight back into Lock (a hot lock) asks within microseconds, while the
// waiter its release woke needs a wake-up and a round trip: under 8
// contending drivers the releaser took the lock again about half of the
// time. The server gives a releaser no cheap sign that someone waits, so
// the sign is the driver's own: it was refused the name by the server
// lately, or has waiters of its own for it. After the last release of a
// mutex so contended, this driver's next attempts on the name wait up to
// yieldFor before they ask the server, leaving the lock to the waiter the
// release woke; the attempt is then made as usual (granted if nobody took
// the lock meanwhile, so a TryLock is never refused for standing back,
// only delayed). A waiting Lock the server already refused does not stand
// back: its next attempt answers a wake-up, and it may be the very waiter
// the release woke (a goroutine of this driver). The sign is dropped when
// a stand-back gave the lock to nobody (this driver's next grant has the
// token right after its previous one, so no one else was granted in
// between): a driver that only competed with itself stops standing back.

// yieldFor is how long a release of a contended lock leaves it to others:
// a woken waiter needs well under a millisecond to make its grant
// statement.
const yieldFor = 2 * time.Millisecond

// contendedFor is how long a refusal by the server marks a name as
// contended.
const contendedFor = time.Second

// refusals records when the server last refused this driver each name: a
// sign that the name is contended, kept for contendedFor. All methods are
// safe for concurrent use.
type refusals struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newRefusals() *refusals { return &refusals{at: map[string]time.Time{}} }

// add records that the server refused this driver name now.
func (r *refusals) add(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.at) >= 4096 {
		clear(r.at)
	}
	r.at[name] = time.Now()
}

// recent reports whether the server refused this driver name within the
// last contendedFor.
func (r *refusals) recent(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[name]
	return ok && time.Since(at) < contendedFor
}

// forget drops name's record.
func (r *refusals) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.at, name)
}

// standBack is a driver's record of contended names, of its refused
// waiters and of the stand-backs under way. All methods are safe for concurrent use.
type standBack struct {
	refusals *refusals
	mu       sync.Mutex
	yields   map[string]yield // stand-backs since the last release, until the next grant
	// waiting lists the waiting Locks (name and owner) the server refused,
	// until their grant: their next attempts are answers to a wake-up,
	// which never stand back.
	waiting map[string]struct{}
}

type yield struct {
	until time.Time
	token uint64 // of the release that started it
}

func newStandBack(r *refusals) *standBack {
	return &standBack{refusals: r, yields: map[string]yield{}, waiting: map[string]struct{}{}}
}

// waitKey is req's entry in standBack.waiting.
func waitKey(req driver.AcquireRequest) string { return req.Name + "\x00" + req.Owner }

// refused records that the server refused req: its name is contended, and
// a waiting Lock's later attempts are exempt from standing back.
func (s *standBack) refused(req driver.AcquireRequest) {
	s.refusals.add(req.Name)
	if !req.Waiting {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) >= 4096 {
		clear(s.waiting) // Locks that gave up: their retries may stand back once
	}
	s.waiting[waitKey(req)] = struct{}{}
}

// exempt reports whether req is a waiting Lock's retry after a refusal.
func (s *standBack) exempt(req driver.AcquireRequest) bool {
	if !req.Waiting {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.waiting[waitKey(req)]
	return ok
}

// released records the release of the grant of name with token; watching
// says whether this driver has waiters for name. If name is contended, the
// driver's attempts on it stand back from now on (see yielding).
func (s *standBack) released(name string, token uint64, watching bool) {
	if !watching && !s.refusals.recent(name) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.yields) >= 4096 {
		clear(s.yields)
	}
	s.yields[name] = yield{until: time.Now().Add(yieldFor), token: token}
}

// yielding returns how long this driver's attempts on name still stand
// back (0: none).
func (s *standBack) yielding(name string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	y, ok := s.yields[name]
	if !ok {
		return 0
	}
	return max(time.Until(y.until), 0)
}

// granted records a new grant of name to this driver with token. If the
// driver stood back since its last release and nobody else was granted the
// lock meanwhile (token follows that release's), nobody was waiting for it
// elsewhere: the name no longer counts as contended.
func (s *standBack) granted(req driver.AcquireRequest, token uint64) {
	name := req.Name
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Waiting {
		delete(s.waiting, waitKey(req))
	}
	y, ok := s.yields[name]
	if !ok {
		return
	}
	delete(s.yields, name)
	if token == y.token+1 {
		s.refusals.forget(name)
	}
}

// standBackFor delays req's attempt while this driver stands back from
// its lock (at most yieldFor, never past ctx); it returns ctx's error if
// ctx ended meanwhile.
func (d *Driver) standBackFor(ctx context.Context, req driver.AcquireRequest) error {
	if d.stand == nil || req.Kind != driver.Exclusive || d.stand.exempt(req) {
		return nil
	}
	left := d.stand.yielding(req.Name)
	if left <= 0 {
		return nil
	}
	if d.testHookStandBack != nil {
		d.testHookStandBack()
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
