package driver

import "context"

// Kind says what sort of lock an AcquireRequest (and the Lease it grants)
// is for. The zero value is the mutex every driver implements; the others
// are optional, and the dlock package sends them only to drivers whose
// Kinder says they support them, so a driver that knows nothing of kinds is
// never asked for one and never grants a plain mutex in its place.
//
// Each kind of a name is its own lock: Mutex "x", RWMutex "x" and Semaphore
// "x" are three different locks, stored apart, that never exclude one
// another. Read and Write are the two sides of the one read/write lock of a
// name.
type Kind uint8

const (
	// Exclusive is a mutex: one holder at a time.
	Exclusive Kind = iota
	// Read is the shared side of a read/write lock: any number of Read
	// holders at once, none while a Write is held. Writer preference: while
	// a Write request waits (AcquireRequest.Waiting) or is queued, new Read
	// requests of other owners are refused with ErrLocked (or queue behind
	// it), so writers never starve.
	Read
	// Write is the exclusive side of a read/write lock: one holder, no
	// readers.
	Write
	// Permit is one permit of a counting semaphore of
	// AcquireRequest.Permits permits: at most that many holders at once.
	// The count binds while any permit is held or kept by a lock-delay; a
	// request to an idle semaphore sets it (see AcquireRequest.Permits).
	Permit
)

// String returns "mutex", "read", "write" or "permit".
func (k Kind) String() string {
	switch k {
	case Exclusive:
		return "mutex"
	case Read:
		return "read"
	case Write:
		return "write"
	case Permit:
		return "permit"
	}
	return "kind(" + itoa(int(k)) + ")"
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// Token rules per kind (every kind keeps the package doc's rules for its own
// name and kind):
//   - Read and Write share one counter per name: every grant, read or
//     write, gets a token strictly greater than every earlier grant of the
//     name's read/write lock. So a resource that refuses tokens below the
//     highest it has seen fences writers from stale readers and writers.
//   - Permit: every grant of a semaphore's name gets a token strictly
//     greater than every earlier permit grant of that name.
//
// Re-entry per kind: a request by an owner that already holds the same
// kind of the same name re-enters (count up, token unchanged), as for
// mutexes. An owner holding Read that asks for Write (an upgrade) is refused
// with ErrLocked like any other writer while readers remain, itself
// included; the dlock package never sends such a request from one lease.
//
// Lock-delay applies per holder: a Read or Permit grant that ends without a
// release keeps its own place taken (a read hold blocks writers, a permit
// stays counted) for its LockDelay beyond its expiry.

// Kinder is implemented by drivers that support kinds beyond Exclusive.
// SupportsKind reports whether TryAcquire (and Acquire, for a Queuer)
// handles requests of kind k; the dlock package refuses other kinds with
// an error wrapping ErrUnsupported before the driver sees them.
type Kinder interface {
	SupportsKind(k Kind) bool
}

// Withdrawer is implemented by drivers that record waiting writers for
// writer preference (a Write request with AcquireRequest.Waiting set that
// was refused leaves a mark that holds back new readers). The dlock package
// calls Withdraw once when a waiting Lock gives up (its context ended, an
// error that is not retried) so the mark does not hold readers back until
// it expires. Marks must also expire on their own (within about the
// request's TTL of the last refused attempt), since a waiter can crash.
// Withdraw never affects a grant.
type Withdrawer interface {
	Withdraw(ctx context.Context, req AcquireRequest) error
}

// MultiAcquirer is implemented by drivers that can take several mutexes in
// one atomic round trip (one script, one transaction).
type MultiAcquirer interface {
	// TryAcquireMulti takes every request's lock (all Kind Exclusive, one
	// owner, distinct names in the dlock package's canonical order) or none.
	// It returns one Grant per request, in order, or an error wrapping
	// ErrLocked (a *LockedError for the first busy name) with nothing
	// taken, or another error when the outcome is unknown (the dlock
	// package then releases each name on a best-effort basis). It returns
	// an error wrapping ErrUnsupported, with nothing taken, for a set it
	// cannot take atomically (names in different Redis Cluster hash
	// slots); the dlock package then takes the names one by one.
	TryAcquireMulti(ctx context.Context, reqs []AcquireRequest) ([]Grant, error)
}

// FenceRaiser is implemented by drivers that can raise a name's fencing
// counter, which the quorum lock uses to keep tokens strictly increasing
// across independent backends.
type FenceRaiser interface {
	// RaiseFence makes the next grant of kind k of name carry a token
	// greater than atLeast: it sets the counter to atLeast if it is lower
	// and leaves it alone otherwise. It never changes a current holder's
	// grant.
	//
	// "The next grant" is every grant returned after RaiseFence returned
	// nil, once the current holders' grants have ended. A driver over
	// several nodes (redlock, quorum) must keep that for a grant completed
	// from node grants that began before the raise (a slow or failed
	// attempt of another owner): a quorum of raised nodes is not enough,
	// since a raised node held by that owner proves nothing and the owner
	// can complete its quorum with an unraised node once the caller
	// releases it. Only raised nodes whose grant to the caller is live
	// could make up such a quorum, and RaiseFence does not say who the
	// caller is, so redlock and quorum succeed only once every node is
	// raised.
	//
	// The quorum lock calls RaiseFence on a backend that granted it while
	// its grant there is live, and counts a backend whose raise failed as
	// not raised.
	RaiseFence(ctx context.Context, name string, k Kind, atLeast uint64) error
}
