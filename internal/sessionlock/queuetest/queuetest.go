// Package queuetest holds the driver-level tests and benchmark helpers that
// the queue-based drivers (etcdlock, zklock) share. Only their tests import
// it.
package queuetest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

// Driver is a queue-based driver.
type Driver interface {
	driver.Driver
	driver.Queuer
}

// Backend is what the shared tests need of one driver package, against a
// running server. Every function fails t on an error.
type Backend struct {
	// NewDriver returns a driver on a connection of its own, closed when t
	// ends.
	NewDriver func(t testing.TB) Driver
	// Queue lists the queue entries (keys, nodes) of the lock name.
	Queue func(t testing.TB, name string) []string
	// Drop deletes the queue entries of name behind the driver's back.
	Drop func(t testing.TB, name string)
	// TTL is the session TTL of the drivers NewDriver makes: Grant.TTL must
	// lie between it and one second more.
	TTL time.Duration
	// CleanupAtOnce is set when a cancelled Acquire deletes its queue entry
	// before it returns (else the entry must go soon after).
	CleanupAtOnce bool
	// Kill, when not nil, ends driver d the way a crash would: nothing is
	// released, and its grants end on the server (at once or when their
	// session expires) leaving their lock-delay guards behind. It returns
	// at once.
	Kill func(t testing.TB, d Driver)
}

// Run runs the shared driver tests against be, each as a subtest.
func Run(t *testing.T, be Backend) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Backend)
	}{
		{"TryAcquireExcludesAndTokensIncrease", TryAcquireExcludesAndTokensIncrease},
		{"ReentranceAndOwners", ReentranceAndOwners},
		{"AcquireQueuesInOrder", AcquireQueuesInOrder},
		{"CancelledAcquireLeavesNothing", CancelledAcquireLeavesNothing},
		{"RenewFindsDeletedEntry", RenewFindsDeletedEntry},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, be) })
	}
}

// Main is a driver package's TestMain: it starts the single-server cluster
// its tests share with start, stores it in *shared and its endpoints,
// comma-separated, in the environment variable env (for the examples), runs
// the tests, stops the server and then (goleak.VerifyTestMain would exit
// before the server is stopped) checks for leaked goroutines with opts. It exits with the
// tests' code, or 1 when the server cannot start or a goroutine leaked.
func Main(m *testing.M, pkg, env string, start func(int) (*testserver.Cluster, error), shared **testserver.Cluster, opts ...goleak.Option) {
	c, err := start(1)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s tests: cannot start the server: %v\n", pkg, err)
		os.Exit(1)
	}
	*shared = c
	// The package's examples read the server's address from env, as an
	// application would read its configuration.
	if err := os.Setenv(env, strings.Join(c.Endpoints(), ",")); err != nil {
		fmt.Fprintf(os.Stderr, "%s tests: %v\n", pkg, err)
		os.Exit(1)
	}
	code := 0
	func() {
		defer c.Stop()
		code = m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Open calls open and fails t on an error; the driver is closed when t
// ends.
func Open[D interface{ Close() error }](t testing.TB, open func() (D, error)) D {
	t.Helper()
	d, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Req is a request of owner for name.
func Req(name, owner string) driver.AcquireRequest {
	return driver.AcquireRequest{Name: name, Owner: owner, TTL: time.Second}
}

// Lease is the lease of g, granted to owner on name.
func Lease(name, owner string, g driver.Grant) driver.Lease {
	return driver.Lease{Name: name, Owner: owner, Token: g.Token, Handle: g.Handle, TTL: g.TTL}
}

// Ctx is a context that ends after d or when t ends.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond until it holds, failing t if it does not within
// within.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, within, what, cond)
}
