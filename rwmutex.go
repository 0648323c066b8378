package dlock

import (
	"context"

	"github.com/dlock/dlock/driver"
)

// RWMutex is a named read/write lock: any number of readers at once, or one
// writer. It is a different lock from the Mutex and the Semaphore of the
// same name (they never exclude one another); a MultiMutex takes Mutexes.
//
// Writer preference: once a writer waits (Lock), new readers wait behind it
// (RLock waits, TryRLock fails with ErrLocked) until it has been granted and
// has released, so a stream of readers never starves writers, as with
// sync.RWMutex and Curator's InterProcessReadWriteLock. A waiting writer
// that gives up (its context ends) withdraws at once; one that crashes
// stops holding readers back within about one TTL.
//
// Fencing: every grant of the name's RWMutex, read or write, carries a
// token strictly greater than every earlier grant of it, so a resource that
// refuses tokens below the highest it has seen fences writers from stale
// readers and writers alike. Readers that hold at the same time have
// different tokens.
//
// Each grant is a Lease with the Mutex's guarantees: it renews itself, its
// loss is signalled (Done, Context, Err), lock-delay applies to a read or
// write hold that ends without Unlock, and Unlock is owner-only. A Lease
// holds one side: there is no upgrade from read to write (a reader that asks
// for the write lock waits for every reader, itself included, so it must
// Unlock its read lease first) and no downgrade.
//
// Backends without read/write locks (no driver.Kinder support for Read and
// Write) fail every call with an error wrapping ErrUnsupported. An RWMutex
// is safe for concurrent use and may be used for many grants.
type RWMutex struct {
	r, w *Mutex
}

// NewRWMutex returns the read/write lock called name. opts may be nil for
// the client's defaults; they apply to both sides. Invalid names or options
// are reported by the lock calls, wrapping ErrInvalid.
func (c *Client) NewRWMutex(name string, opts *MutexOptions) *RWMutex {
	return &RWMutex{r: c.newLock(name, driver.Read, 0, opts), w: c.newLock(name, driver.Write, 0, opts)}
}

// Name returns the lock's name.
func (rw *RWMutex) Name() string { return rw.w.name }

// RLock takes the lock for reading, waiting while a writer holds it or
// waits for it. It waits and retries as Mutex.Lock does.
func (rw *RWMutex) RLock(ctx context.Context) (*Lease, error) { return rw.r.acquire(ctx, true) }

// TryRLock makes one attempt to take the lock for reading. It fails with an
// error wrapping ErrLocked at once while a writer holds the lock, waits for
// it, or it is inside a writer's lock-delay.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Lease, error) { return rw.r.acquire(ctx, false) }

// Lock takes the lock for writing, waiting while readers or a writer hold
// it. While it waits, new readers are held back (writer preference); the
// dlock package retries at least every TTL/3 so that the backend keeps
// seeing the writer wait, and withdraws the writer when Lock gives up. It
// otherwise waits and retries as Mutex.Lock does.
func (rw *RWMutex) Lock(ctx context.Context) (*Lease, error) { return rw.w.acquire(ctx, true) }

// TryLock makes one attempt to take the lock for writing; it fails with an
// error wrapping ErrLocked at once while readers or a writer hold it. A
// failed TryLock does not hold readers back.
func (rw *RWMutex) TryLock(ctx context.Context) (*Lease, error) { return rw.w.acquire(ctx, false) }
