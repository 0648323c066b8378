package dlockotel_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlockotel"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/dlock/dlock/memlock"
	_ "github.com/dlock/dlock/sqlitelock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// otelEnv is an SDK with an in-memory span exporter and a manual metric
// reader.
type otelEnv struct {
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	hooks  *dlockotel.Hooks
}

func newEnv(t *testing.T, names bool) *otelEnv {
	t.Helper()
	e := &otelEnv{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		_ = e.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	h, err := dlockotel.New(&dlockotel.Options{TracerProvider: e.tp, MeterProvider: mp, LockNames: names})
	if err != nil {
		t.Fatal(err)
	}
	e.hooks = h
	return e
}

// span returns the ended spans called name.
func (e *otelEnv) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range e.spans.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// metric collects and returns the metric called name.
func (e *otelEnv) metric(t *testing.T, name string) metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != dlockotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data
			}
		}
	}
	return nil
}

// has reports whether set holds every pair of want.
func has(set attribute.Set, want ...attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum returns the value of an int64 sum's point whose attributes hold want.
func (e *otelEnv) sum(t *testing.T, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	d, _ := e.metric(t, name).(metricdata.Sum[int64])
	for _, p := range d.DataPoints {
		if has(p.Attributes, want...) {
			return p.Value
		}
	}
	return 0
}

// hist returns the count and sum of a histogram's point whose attributes
// hold want.
func (e *otelEnv) hist(t *testing.T, name string, want ...attribute.KeyValue) (uint64, float64) {
	t.Helper()
	d, _ := e.metric(t, name).(metricdata.Histogram[float64])
	for _, p := range d.DataPoints {
		if has(p.Attributes, want...) {
			return p.Count, p.Sum
		}
	}
	return 0, 0
}

var (
	mem   = dlockotel.KeyBackend.String("mem")
	mutex = dlockotel.KeyKind.String("mutex")
)

func TestSpans(t *testing.T) {
	e := newEnv(t, false)
	c := dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{Hooks: e.hooks})
	defer c.Close()

	ctx, parent := e.tp.Tracer("test").Start(context.Background(), "job")
	m := c.NewMutex("orders/42", nil)
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock: %v", err)
	}
	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Unlock: %v", err)
	}
	parent.End()

	got := make([]string, 0)
	for _, s := range e.spans.GetSpans() {
		got = append(got, s.Name)
	}
	want := []string{"dlock.Mutex.Lock", "dlock.Mutex.TryLock", "dlock.Lease.Extend", "dlock.Lease.Unlock", "dlock.Lease.Unlock", "job"}
	if !slices.Equal(got, want) {
		t.Fatalf("spans %q, want %q", got, want)
	}
	spans := e.spans.GetSpans()
	for _, s := range spans[:5] {
		if s.Parent.SpanID() != parent.SpanContext().SpanID() {
			t.Fatalf("span %s is not a child of the caller's span", s.Name)
		}
		if attr(s, dlockotel.KeyBackend).AsString() != "mem" || attr(s, dlockotel.KeyName).AsString() != "orders/42" ||
			attr(s, dlockotel.KeyKind).AsString() != "mutex" {
			t.Fatalf("span %s attributes %v", s.Name, s.Attributes)
		}
	}
	lock, try, unlock2 := spans[0], spans[1], spans[4]
	if attr(lock, dlockotel.KeyToken).AsInt64() != int64(l.Token()) || attr(lock, dlockotel.KeyOutcome).AsString() != "ok" ||
		attr(lock, dlockotel.KeyAttempts).AsInt64() != 1 || attr(lock, dlockotel.KeyContended).AsBool() || lock.Status.Code != codes.Unset {
		t.Fatalf("Lock span %v %v", lock.Attributes, lock.Status)
	}
	if len(lock.Events) != 1 || lock.Events[0].Name != "attempt" {
		t.Fatalf("Lock span events %v", lock.Events)
	}
	if attr(try, dlockotel.KeyOutcome).AsString() != "locked" || !attr(try, dlockotel.KeyContended).AsBool() || try.Status.Code != codes.Unset {
		t.Fatalf("refused TryLock span %v %v", try.Attributes, try.Status)
	}
	var holder int64
	for _, kv := range try.Events[0].Attributes {
		if kv.Key == dlockotel.KeyHolderToken {
			holder = kv.Value.AsInt64()
		}
	}
	if holder != int64(l.Token()) {
		t.Fatalf("refused attempt's holder token %d, want %d", holder, l.Token())
	}
	if attr(spans[2], dlockotel.KeyToken).AsInt64() != int64(l.Token()) || attr(spans[3], dlockotel.KeyOutcome).AsString() != "ok" {
		t.Fatalf("Extend/Unlock spans %v %v", spans[2].Attributes, spans[3].Attributes)
	}
	if attr(unlock2, dlockotel.KeyOutcome).AsString() != "not_held" || unlock2.Status.Code != codes.Error || len(unlock2.Events) != 1 {
		t.Fatalf("second Unlock span %v %v %v", unlock2.Attributes, unlock2.Status, unlock2.Events)
	}
}

// A MultiMutex Lock that waits takes its names one by one: their spans nest
// under the MultiMutex's.
func TestMultiSpansNest(t *testing.T) {
	e := newEnv(t, false)
	c := dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{Hooks: e.hooks, WaitMax: 10 * time.Millisecond})
	defer c.Close()
	ctx := context.Background()
	b, err := c.NewMutex("b", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ml, err := c.NewMultiMutex([]string{"b", "a"}, nil).Lock(ctx)
		if err == nil {
			err = ml.Unlock(ctx)
		}
		done <- err
	}()
	// The multi-lock's part "a" is granted, then it waits for "b".
	testwait.Until(t, 20*time.Second, "the MultiMutex to take its first name", func() bool {
		return len(e.named("dlock.Mutex.Lock")) >= 2
	})
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the MultiMutex Lock did not return")
	}
	multi := e.named("dlock.MultiMutex.Lock")
	if len(multi) != 1 || attr(multi[0], dlockotel.KeyName).AsString() != "a,b" || attr(multi[0], dlockotel.KeyKind).AsString() != "multi" {
		t.Fatalf("MultiMutex spans %+v", multi)
	}
	var parts []string
	for _, s := range e.named("dlock.Mutex.Lock") {
		if s.Parent.SpanID() == multi[0].SpanContext.SpanID() {
			parts = append(parts, attr(s, dlockotel.KeyName).AsString())
		}
	}
	if !slices.Equal(parts, []string{"a", "b"}) {
		t.Fatalf("part spans under the MultiMutex's: %q, want a, b", parts)
	}
}

func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, true)
		d := memlock.NewBackend().NewDriver()
		c := dlock.New(d, &dlock.Options{TTL: 3 * time.Second, Hooks: e.hooks})
		defer c.Close()
		ctx := context.Background()
		name := dlockotel.KeyName.String("m")
		l, err := c.NewMutex("m", nil).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.NewMutex("m", nil).TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("TryLock: %v", err)
		}
		if got := e.sum(t, "dlock.grants", mem, mutex, name); got != 1 {
			t.Fatalf("grants %d", got)
		}
		if got := e.sum(t, "dlock.leases.held", mem, mutex, name); got != 1 {
			t.Fatalf("held %d", got)
		}
		if got := e.sum(t, "dlock.contentions", mem, mutex, name); got != 1 {
			t.Fatalf("contentions %d", got)
		}
		if n, _ := e.hist(t, "dlock.acquire.wait.duration", mem, mutex, name, dlockotel.KeyOutcome.String("locked")); n != 1 {
			t.Fatalf("wait observations (locked) %d", n)
		}
		time.Sleep(1500 * time.Millisecond) // on the bubble's clock: the renewal at TTL/3 gets through
		if n, _ := e.hist(t, "dlock.renewal.duration", mem); n != 1 {
			t.Fatalf("renewal calls %d, want 1", n)
		}
		d.FailCalls(func(op string) error {
			if op == "renew" {
				return errors.New("connection cut")
			}
			return nil
		})
		<-l.Done()
		if got := e.sum(t, "dlock.renewal.failures", mem, mutex, name); got < 2 {
			t.Fatalf("renewal failures %d, want several", got)
		}
		if got := e.sum(t, "dlock.losses", mem, mutex, name, dlockotel.KeyCause.String("deadline")); got != 1 {
			t.Fatalf("losses %d", got)
		}
		if got := e.sum(t, "dlock.leases.held", mem, mutex, name); got != 0 {
			t.Fatalf("held after the loss %d", got)
		}
		if n, s := e.hist(t, "dlock.hold.duration", mem, mutex, name, dlockotel.KeyOutcome.String("lost")); n != 1 || s < 2 {
			t.Fatalf("hold observations %d, sum %vs", n, s)
		}
	})
}

// The same spans and metrics over a real backend: an SQLite file.
func TestSQLite(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	c, err := dlock.OpenWith(ctx, "sqlite://"+filepath.Join(t.TempDir(), "l.db"), &dlock.Options{Hooks: e.hooks})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rw := c.NewRWMutex("cfg", nil)
	r, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock beside a reader: %v", err)
	}
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	sqlite := dlockotel.KeyBackend.String("sqlite")
	rl := e.named("dlock.RWMutex.RLock")
	if len(rl) != 1 || attr(rl[0], dlockotel.KeyBackend).AsString() != "sqlite" || attr(rl[0], dlockotel.KeyKind).AsString() != "read" ||
		attr(rl[0], dlockotel.KeyToken).AsInt64() != int64(r.Token()) {
		t.Fatalf("RLock spans %+v", rl)
	}
	if tl := e.named("dlock.RWMutex.TryLock"); len(tl) != 1 || attr(tl[0], dlockotel.KeyOutcome).AsString() != "locked" {
		t.Fatalf("TryLock spans %+v", tl)
	}
	if got := e.sum(t, "dlock.contentions", sqlite, dlockotel.KeyKind.String("write")); got != 1 {
		t.Fatalf("contentions %d", got)
	}
	if n, _ := e.hist(t, "dlock.hold.duration", sqlite, dlockotel.KeyKind.String("read"), dlockotel.KeyOutcome.String("released")); n != 1 {
		t.Fatalf("hold observations %d", n)
	}
	if got := e.sum(t, "dlock.leases.held", sqlite, dlockotel.KeyKind.String("read")); got != 0 {
		t.Fatalf("held %d", got)
	}
}
