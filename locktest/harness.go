// Package locktest is the conformance suite and benchmark set every dlock
// driver passes. A driver's test file supplies a Harness and calls
//
//	func TestConformance(t *testing.T) { locktest.RunConformanceTests(t, newHarness) }
//	func BenchmarkLocks(b *testing.B)   { locktest.RunBenchmarks(b, newHarness) }
//
// The suite talks to the driver only through the dlock package, the way users
// do, plus the Harness for what users cannot do (crash a process, make the
// server drop a lease).
package locktest

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// Harness connects the suite to one backend under test.
type Harness interface {
	// NewDriver returns a new driver connected to the backend, as a separate
	// process would be: its own connections and session. The suite closes
	// it (through dlock.Client.Close) or kills it (through Kill).
	NewDriver(ctx context.Context) (driver.Driver, error)

	// Kill simulates the crash of the process that owns d: d stops all
	// network traffic and background work at once, without releasing
	// anything or ending its session cleanly, so the backend learns of the
	// loss only by expiry. Calls on d afterwards fail.
	Kill(d driver.Driver) error

	// Drop makes the backend forget the current grant on name, as if it had
	// expired or its session had been lost, without telling the holder. The
	// lock's fencing counter must survive.
	Drop(ctx context.Context, name string) error

	// Config describes the backend's abilities and the timings to test with.
	Config() Config

	// Close releases what the harness holds. The server itself is stopped by
	// the test's cleanup.
	Close()
}

// Config tells the suite what to expect of a backend.
type Config struct {
	// TTL is the lease TTL the suite uses where it waits for expiry: as
	// short as the backend handles reliably on a loaded 2-core machine.
	// Default 1s.
	TTL time.Duration
	// LockDelay reports whether the backend honours LockDelay > 0. When
	// false the suite checks that asking for it fails with ErrUnsupported.
	LockDelay bool
	// SessionBound reports that a grant's TTL is its session's (etcd,
	// ZooKeeper, pinned SQL connections), so per-lock TTLs other than the
	// session's are not exact.
	SessionBound bool
	// Clients is how many separate drivers the multi-client tests use.
	// Default 3.
	Clients int
	// RenewLeases is how many leases the Renew benchmark holds at once.
	// Default 10,000; backends that pin a connection per lease set it to
	// what their pool allows.
	RenewLeases int
}

// NewHarness starts or connects to a backend for one top-level test.
type NewHarness func(ctx context.Context, t testing.TB) (Harness, error)

// Floors is implemented by harnesses that can measure raw floors for the
// benchmarks: the cheapest way to do the same work on the same connection
// without dlock, so results can be printed as ratios measured in one run.
type Floors interface {
	// AcquireReleaseFloor returns an operation that takes and frees key with
	// the backend's bare primitives (e.g. SET NX PX plus a scripted delete).
	AcquireReleaseFloor(ctx context.Context) (op func(ctx context.Context, key string) error, cleanup func(), err error)
	// RoundTripFloor returns one bare round trip (e.g. PING, SELECT 1).
	RoundTripFloor(ctx context.Context) (op func(ctx context.Context) error, cleanup func(), err error)
}

// KindDropper is implemented by the harness of every backend whose driver
// supports lock kinds beyond the mutex (driver.Kinder): the RWMutex and
// Semaphore sections use it to check that loss is signalled, and fail when
// the driver supports a kind the harness cannot drop.
type KindDropper interface {
	// DropKind makes the backend forget the current grants of kind k on
	// name — every read holder for driver.Read, the writer for
	// driver.Write, every permit holder for driver.Permit — as Drop does
	// for a mutex: as if they had expired or their sessions had been lost,
	// without telling the holders and without lock-delay. The name's
	// fencing counter (and a semaphore's stored permit count) survive.
	DropKind(ctx context.Context, name string, k driver.Kind) error
}
