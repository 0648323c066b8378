package dlockprom_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlockprom"
	"github.com/dlock/dlock/memlock"
	_ "github.com/dlock/dlock/sqlitelock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// registry returns a fresh registry with m registered.
func registry(t *testing.T, m *dlockprom.Metrics) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatalf("Register: %v", err)
	}
	return reg
}

// sample finds the metric family name in reg's gathered output and the
// metric among it whose labels include every pair of want; nil if none.
func sample(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

// value returns a counter's or gauge's value, or a histogram's sample
// count, of the metric sample finds (0 if none).
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := sample(t, reg, name, labels)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("%s: unexpected metric type", name)
	return 0
}

// histSum returns a histogram's sum of observations.
func histSum(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := sample(t, reg, name, labels)
	if m == nil || m.Histogram == nil {
		t.Fatalf("no histogram %s%v", name, labels)
	}
	return m.Histogram.GetSampleSum()
}

func lbl(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// refusals signals each refused attempt of a waiting acquire, so a test
// knows that a Lock waits.
type refusals struct {
	dlock.NopHooks
	ch chan struct{}
}

func newRefusals() refusals { return refusals{ch: make(chan struct{}, 100)} }

func (r refusals) Attempt(_ context.Context, op dlock.OpInfo, a dlock.AttemptInfo) {
	if op.Waits() && a.Outcome == dlock.OutcomeLocked {
		select {
		case r.ch <- struct{}{}:
		default:
		}
	}
}

// await waits for a refused attempt of a waiting acquire.
func (r refusals) await(t *testing.T) {
	t.Helper()
	select {
	case <-r.ch:
	case <-time.After(20 * time.Second):
		t.Fatal("no waiting acquire was refused")
	}
}

func wantValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	if got := value(t, reg, name, labels); got != want {
		t.Fatalf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func TestMetricsOnMemlock(t *testing.T) {
	m := dlockprom.New(nil)
	reg := registry(t, m)
	refused := newRefusals()
	c := dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{Hooks: dlock.JoinHooks(m, refused), WaitMax: 20 * time.Millisecond})
	defer c.Close()
	ctx := context.Background()
	mutex := lbl("backend", "mem", "kind", "mutex")

	mu := c.NewMutex("orders/1", nil)
	l, err := mu.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	wantValue(t, reg, "dlock_grants_total", mutex, 1)
	wantValue(t, reg, "dlock_leases_held", mutex, 1)
	wantValue(t, reg, "dlock_acquire_wait_seconds", lbl("backend", "mem", "kind", "mutex", "outcome", "ok"), 1)
	wantValue(t, reg, "dlock_contentions_total", mutex, 0)

	if _, err := mu.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock of a held lock: %v", err)
	}
	wantValue(t, reg, "dlock_contentions_total", mutex, 1)
	wantValue(t, reg, "dlock_acquire_wait_seconds", lbl("backend", "mem", "kind", "mutex", "outcome", "locked"), 1)

	// A Lock that waits for the holder: contended, and its wait is in the
	// histogram.
	got := make(chan error, 1)
	go func() {
		l2, err := mu.Lock(ctx)
		if err == nil {
			err = l2.Unlock(ctx)
		}
		got <- err
	}()
	refused.await(t)
	waiting := time.Now()
	held := waiting.Sub(granted)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waited := time.Since(waiting)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting Lock did not get the lock")
	}
	okWait := lbl("backend", "mem", "kind", "mutex", "outcome", "ok")
	wantValue(t, reg, "dlock_acquire_wait_seconds", okWait, 2)
	if s := histSum(t, reg, "dlock_acquire_wait_seconds", okWait); s < waited.Seconds() {
		t.Fatalf("sum of the waits %vs, want at least the %v the second Lock waited after a refusal", s, waited)
	}
	wantValue(t, reg, "dlock_contentions_total", mutex, 2)
	wantValue(t, reg, "dlock_grants_total", mutex, 2)
	wantValue(t, reg, "dlock_leases_held", mutex, 0)
	released := lbl("backend", "mem", "kind", "mutex", "outcome", "released")
	wantValue(t, reg, "dlock_hold_seconds", released, 2)
	if s := histSum(t, reg, "dlock_hold_seconds", released); s < held.Seconds() {
		t.Fatalf("sum of the holds %vs, want at least the first holder's %v", s, held)
	}

	// Other kinds are labelled as such.
	p, err := c.NewSemaphore("enc", 2, nil).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantValue(t, reg, "dlock_leases_held", lbl("backend", "mem", "kind", "permit"), 1)
	_ = p.Unlock(ctx)
	wantValue(t, reg, "dlock_leases_held", lbl("backend", "mem", "kind", "permit"), 0)

	// No name label unless asked for.
	if s := sample(t, reg, "dlock_grants_total", mutex); s == nil || len(s.GetLabel()) != 2 {
		t.Fatalf("labels of dlock_grants_total: %v", s.GetLabel())
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
}

// Renewal failures, then the loss at the deadline; a drop found by
// renewal; Close.
func TestMetricsRenewalFailuresAndLosses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := dlockprom.New(&dlockprom.Options{LockNames: true})
		reg := registry(t, m)
		d := memlock.NewBackend().NewDriver()
		c := dlock.New(d, &dlock.Options{TTL: 3 * time.Second, Hooks: m})
		defer c.Close()
		ctx := context.Background()
		failing, err := c.NewMutex("failing", nil).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // one renewal gets through
		if n := value(t, reg, "dlock_renewal_seconds", lbl("backend", "mem")); n != 1 {
			t.Fatalf("renewal calls observed: %v, want 1", n)
		}
		cut := errors.New("connection cut")
		d.FailCalls(func(op string) error {
			if op == "renew" {
				return cut
			}
			return nil
		})
		<-failing.Done()
		name := lbl("backend", "mem", "kind", "mutex", "name", "failing")
		if n := value(t, reg, "dlock_renewal_failures_total", name); n < 2 {
			t.Fatalf("renewal failures %v, want several before the loss", n)
		}
		wantValue(t, reg, "dlock_losses_total", lbl("backend", "mem", "kind", "mutex", "name", "failing", "cause", "deadline"), 1)
		wantValue(t, reg, "dlock_hold_seconds", lbl("backend", "mem", "kind", "mutex", "name", "failing", "outcome", "lost"), 1)
		wantValue(t, reg, "dlock_leases_held", name, 0)

		d.FailCalls(nil)
		dropped, err := c.NewMutex("dropped", nil).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.NewRWMutex("cfg", nil).RLock(ctx); err != nil {
			t.Fatal(err)
		}
		d.Backend().Drop("dropped")
		<-dropped.Done()
		wantValue(t, reg, "dlock_losses_total", lbl("name", "dropped", "cause", "not_held"), 1)
		wantValue(t, reg, "dlock_leases_held", lbl("kind", "read", "name", "cfg"), 1)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		wantValue(t, reg, "dlock_leases_held", lbl("kind", "read", "name", "cfg"), 0)
		wantValue(t, reg, "dlock_hold_seconds", lbl("kind", "read", "name", "cfg", "outcome", "closed"), 1)
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
			t.Fatalf("promlint: %v %v", problems, err)
		}
	})
}

// Two clients contend for a lock in an SQLite file, as two processes on
// one machine would; one lease expires unrenewed.
func TestMetricsOnSQLite(t *testing.T) {
	m := dlockprom.New(&dlockprom.Options{LockNames: true, ConstLabels: prometheus.Labels{"service": "test"}})
	reg := registry(t, m)
	url := "sqlite://" + filepath.Join(t.TempDir(), "locks.db")
	ctx := context.Background()
	a, err := dlock.OpenWith(ctx, url, &dlock.Options{Hooks: m})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	refused := newRefusals()
	b, err := dlock.OpenWith(ctx, url+"?wait_max=50ms", &dlock.Options{Hooks: dlock.JoinHooks(m, refused)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.Backend() != "sqlite" {
		t.Fatalf("Backend() = %q", a.Backend())
	}
	job := lbl("backend", "sqlite", "kind", "mutex", "name", "nightly", "service", "test")

	la, err := a.NewMutex("nightly", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	if _, err := b.NewMutex("nightly", nil).TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock from the second client: %v", err)
	}
	wantValue(t, reg, "dlock_leases_held", job, 1)
	wantValue(t, reg, "dlock_contentions_total", job, 1)

	got := make(chan *dlock.Lease, 1)
	go func() {
		lb, err := b.NewMutex("nightly", nil).Lock(ctx)
		if err != nil {
			t.Errorf("waiting Lock: %v", err)
		}
		got <- lb
	}()
	refused.await(t)
	held := time.Since(granted)
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var lb *dlock.Lease
	select {
	case lb = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the second client did not get the lock")
	}
	if lb == nil {
		return
	}
	wantValue(t, reg, "dlock_grants_total", job, 2)
	wantValue(t, reg, "dlock_leases_held", job, 1)
	wantValue(t, reg, "dlock_contentions_total", job, 2)
	if s := histSum(t, reg, "dlock_hold_seconds", lbl("name", "nightly", "outcome", "released")); s < held.Seconds() {
		t.Fatalf("hold time %vs, want at least the first job's %v", s, held)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wantValue(t, reg, "dlock_leases_held", job, 0)

	// A lease without renewal expires at its deadline: a loss.
	short, err := a.NewMutex("short", &dlock.MutexOptions{TTL: time.Second, RenewInterval: -1}).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-short.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the unrenewed lease did not end")
	}
	wantValue(t, reg, "dlock_losses_total", lbl("backend", "sqlite", "name", "short", "cause", "deadline"), 1)

	out, err := testutil.GatherAndCount(reg)
	if err != nil || out == 0 {
		t.Fatalf("GatherAndCount = %d, %v", out, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
	// The text exposition carries the labels a dashboard filters on.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP dlock_grants_total Leases granted (a MultiLease counts one per name).
# TYPE dlock_grants_total counter
dlock_grants_total{backend="sqlite",kind="mutex",name="nightly",service="test"} 2
dlock_grants_total{backend="sqlite",kind="mutex",name="short",service="test"} 1
`), "dlock_grants_total"); err != nil {
		t.Fatal(err)
	}
}

// One Metrics joined with other hooks still counts.
func TestJoined(t *testing.T) {
	m := dlockprom.New(&dlockprom.Options{Namespace: "app_locks"})
	reg := registry(t, m)
	c := dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{Hooks: dlock.JoinHooks(dlock.NopHooks{}, m)})
	defer c.Close()
	l, err := c.NewMutex("x", nil).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	wantValue(t, reg, "app_locks_grants_total", lbl("backend", "mem"), 1)
}

// BenchmarkLockUnlock measures what the metrics add to a Lock+Unlock on
// memlock (compare with the root package's BenchmarkLockUnlockHooks/none).
func BenchmarkLockUnlock(b *testing.B) {
	for _, names := range []bool{false, true} {
		b.Run("names="+strconv.FormatBool(names), func(b *testing.B) {
			m := dlockprom.New(&dlockprom.Options{LockNames: names})
			c := dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{Hooks: m})
			defer c.Close()
			mu := c.NewMutex("bench", nil)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l, err := mu.Lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
