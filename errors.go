package dlock

import (
	"errors"
	"fmt"

	"github.com/dlock/dlock/driver"
)

// Errors returned by dlock. errors.Is works through every wrap, so callers can
// tell a lock held by someone else (ErrLocked) from a cancelled context
// (context.Canceled, context.DeadlineExceeded), a lost lease (ErrLeaseLost)
// and an unreachable backend (an *OpError wrapping the driver's error).
var (
	// ErrLocked: the lock is held by another owner, or is inside its
	// lock-delay. TryLock returns it at once; Lock never returns it.
	ErrLocked = driver.ErrLocked
	// ErrNotHeld: Unlock or Extend was called on a lease that no longer
	// holds the lock (released, expired, lost, or taken over).
	ErrNotHeld = driver.ErrNotHeld
	// ErrUnsupported: the backend cannot honour an option that was asked
	// for. Returned at construction (NewMutex's first use, Open), never
	// silently ignored.
	ErrUnsupported = driver.ErrUnsupported
	// ErrLeaseLost: the lease ended without Unlock: renewal could not
	// confirm it before its validity deadline, the server dropped it, or its
	// session ended. Lease.Err wraps the cause.
	ErrLeaseLost = errors.New("dlock: lease lost")
	// ErrReleased: the lease ended because Unlock was called.
	ErrReleased = errors.New("dlock: lease released")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("dlock: client closed")
	// ErrInvalid: an argument was invalid. The error is an
	// *InvalidArgumentError naming the argument, or a driver's error
	// wrapping it.
	ErrInvalid = driver.ErrInvalid
)

// InvalidArgumentError reports a bad argument: which one, and what is wrong
// with it. It wraps ErrInvalid.
type InvalidArgumentError struct {
	Arg    string // the argument's name, e.g. "name", "TTL", "url"
	Reason string // what is wrong, e.g. "must not be empty"
	cause  error  // the driver's error, when a driver refused a URL
}

func (e *InvalidArgumentError) Error() string {
	return fmt.Sprintf("dlock: invalid %s: %s", e.Arg, e.Reason)
}

// Unwrap returns ErrInvalid, and the driver's error when a driver refused a
// URL.
func (e *InvalidArgumentError) Unwrap() []error {
	if e.cause != nil {
		return []error{ErrInvalid, e.cause}
	}
	return []error{ErrInvalid}
}

func invalid(arg, format string, args ...any) error {
	return &InvalidArgumentError{Arg: arg, Reason: fmt.Sprintf(format, args...)}
}

// OpError is a backend failure: the operation, the lock's name and the
// driver's error. Errors that are sentinels of this package or context errors
// are returned as they are, not wrapped in an OpError.
type OpError struct {
	Op   string // "lock", "trylock", "rlock", "tryrlock", "acquire", "tryacquire", "unlock", "extend", "renew", "open", "inspect", "new" (a lock type the backend lacks)
	Name string // the lock's name, empty for client-wide operations
	Err  error
}

func (e *OpError) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("dlock: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("dlock: %s %q: %v", e.Op, e.Name, e.Err)
}

// Unwrap returns the driver's error.
func (e *OpError) Unwrap() error { return e.Err }
