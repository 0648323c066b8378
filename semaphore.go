package dlock

import (
	"context"
	"math"

	"github.com/dlock/dlock/driver"
)

// Semaphore is a named counting semaphore: at most Permits holders at once.
// It is a different lock from the Mutex and the RWMutex of the same name.
//
// The permit count is stored with the semaphore while any permit is held
// (or inside a lock-delay): a Semaphore of the same name with a different
// count then fails with an error wrapping ErrInvalid that names both counts,
// and changes nothing, rather than silently changing the limit. Once every
// permit is free, the next grant sets the count, so a semaphore can be
// resized by stopping its holders.
//
// Each permit is a Lease with the Mutex's guarantees: it renews itself, its
// loss is signalled, Unlock is owner-only, and a permit whose holder dies
// comes back after its TTL (plus lock-delay). Every grant carries a token
// strictly greater than every earlier permit grant of the name.
//
// Backends without semaphores (no driver.Kinder support for Permit) fail
// every call with an error wrapping ErrUnsupported. A Semaphore is safe for
// concurrent use and may be used for many grants.
type Semaphore struct {
	m *Mutex
}

// maxPermits bounds a semaphore's size, so every backend can store it.
const maxPermits = math.MaxInt32

// NewSemaphore returns the semaphore called name with permits permits (1 to
// 2^31-1; anything else is reported by Acquire and TryAcquire, wrapping
// ErrInvalid). opts may be nil for the client's defaults.
func (c *Client) NewSemaphore(name string, permits int, opts *MutexOptions) *Semaphore {
	if permits < 1 || permits > maxPermits {
		return &Semaphore{m: &Mutex{c: c, name: name, kind: driver.Permit, permits: permits,
			err: invalid("permits", "must be between 1 and %d, got %d", maxPermits, permits)}}
	}
	return &Semaphore{m: c.newLock(name, driver.Permit, permits, opts)}
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.m.name }

// Permits returns the semaphore's size, as given to NewSemaphore.
func (s *Semaphore) Permits() int { return s.m.permits }

// Acquire takes a permit, waiting while all are taken. It waits and retries
// as Mutex.Lock does.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) { return s.m.acquire(ctx, true) }

// TryAcquire makes one attempt to take a permit; it fails with an error
// wrapping ErrLocked at once when all permits are taken.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) { return s.m.acquire(ctx, false) }
