package memlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/locktest"
	"github.com/dlock/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type harness struct{ b *memlock.Backend }

func newHarness(ctx context.Context, t testing.TB) (locktest.Harness, error) {
	return &harness{b: memlock.NewBackend()}, nil
}

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) { return h.b.NewDriver(), nil }
func (h *harness) Kill(d driver.Driver) error                           { d.(*memlock.Driver).Kill(); return nil }
func (h *harness) Drop(ctx context.Context, name string) error          { h.b.Drop(name); return nil }
func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	h.b.DropKind(name, k)
	return nil
}

// Config: a TTL of 1s, as the Redis, Redlock and SQL harnesses use. A
// test process not scheduled for longer than the TTL loses its live
// leases, which the suite reports as violations: with 300ms, stalls of
// 450ms failed every run of the suite.
func (h *harness) Config() locktest.Config {
	return locktest.Config{TTL: time.Second, LockDelay: true}
}
func (h *harness) Close() {}

// Floors: the backend's bare operations, without the dlock package.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	d := h.b.NewDriver()
	return func(ctx context.Context, key string) error {
		g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: key, Owner: "floor", TTL: time.Minute})
		if err != nil {
			return err
		}
		_, err = d.Release(ctx, driver.Lease{Name: key, Owner: "floor", Token: g.Token})
		return err
	}, func() { _ = d.Close() }, nil
}

func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	d := h.b.NewDriver()
	return func(ctx context.Context) error {
		_, err := d.Renew(ctx, nil)
		return err
	}, func() { _ = d.Close() }, nil
}

func TestConformance(t *testing.T) { locktest.RunConformanceTests(t, newHarness) }

func BenchmarkLocks(b *testing.B) { locktest.RunBenchmarks(b, newHarness) }

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	u, _ := url.Parse("mem://openurl-test/a?zeta=1&alpha=2")
	if _, err := memlock.OpenURL(ctx, u); !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), `"alpha"`) {
		t.Fatalf("OpenURL with unknown parameters = %v, want ErrInvalid naming the first one, \"alpha\"", err)
	}
	u, _ = url.Parse("mem://openurl-test/a")
	d, err := memlock.OpenURL(ctx, u)
	if err != nil {
		t.Fatalf("OpenURL: %v", err)
	}
	defer d.Close()
	if got := d.(*memlock.Driver).Backend(); got != memlock.Named("openurl-test/a") {
		t.Fatal("mem://openurl-test/a did not open the backend Named(\"openurl-test/a\")")
	}
}
