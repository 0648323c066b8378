// Package dlockotel traces and measures a dlock Client's locks with
// OpenTelemetry: a span for every Lock, TryLock (and the RWMutex, Semaphore
// and MultiMutex forms), Unlock and Extend, and the metrics of package
// dlockprom through the OpenTelemetry metrics API.
//
//	hooks, err := dlockotel.New(nil) // the global TracerProvider and MeterProvider
//	if err != nil { ... }
//	client, err := dlock.OpenWith(ctx, "etcd://localhost:2379/locks", &dlock.Options{Hooks: hooks})
//
// Spans are named after the call ("dlock.Mutex.Lock", "dlock.RWMutex.RLock",
// "dlock.Semaphore.TryAcquire", "dlock.MultiMutex.Lock", "dlock.Lease.Unlock",
// "dlock.Lease.Extend"), are children of the span in the context the call was
// given, and carry the attributes dlock.backend, dlock.lock.name,
// dlock.lock.kind, dlock.lock.token (once known), dlock.outcome,
// dlock.attempts and dlock.contended; each attempt on the backend is a span
// event. A span's status is Error unless the outcome is ok, or locked (a
// TryLock that found the lock held did what it was asked). The backend's own
// client spans (a traced Redis or pgx client) nest under dlock's, since the
// backend calls get the span's context.
//
// Renewals and losses happen in the Client's background goroutines, outside
// any caller's trace: they are metrics, not spans.
package dlockotel

import (
	"context"
	"math"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock/dlock"
)

// ScopeName is the instrumentation scope of dlockotel's tracer and meter.
const ScopeName = "github.com/dlock/dlock/dlockotel"

// Attribute keys of spans and metrics.
const (
	KeyBackend   = attribute.Key("dlock.backend")
	KeyName      = attribute.Key("dlock.lock.name")
	KeyKind      = attribute.Key("dlock.lock.kind")
	KeyToken     = attribute.Key("dlock.lock.token")
	KeyOutcome   = attribute.Key("dlock.outcome")
	KeyAttempts  = attribute.Key("dlock.attempts")
	KeyContended = attribute.Key("dlock.contended")
	KeyCause     = attribute.Key("dlock.loss.cause")
	// KeyAttempt, KeyLatency, KeyHolderToken and KeyRetryAfter are the
	// attributes of an "attempt" span event: its number, the backend
	// call's latency and, when the lock was held, the holder's token and
	// remaining time as the backend told them (seconds).
	KeyAttempt     = attribute.Key("dlock.attempt")
	KeyLatency     = attribute.Key("dlock.latency")
	KeyHolderToken = attribute.Key("dlock.holder.token")
	KeyRetryAfter  = attribute.Key("dlock.retry_after")
)

// Options configure New. The zero value (or nil) takes every default.
type Options struct {
	// TracerProvider makes the spans; default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics; default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// LockNames adds dlock.lock.name to the metrics' attributes (spans
	// always carry it): a series per name, so only for a bounded set of
	// names.
	LockNames bool
}

// Hooks is a dlock.Hooks that traces and measures with OpenTelemetry. It
// is safe for concurrent use, and one Hooks may serve several Clients.
type Hooks struct {
	dlock.NopHooks
	tracer trace.Tracer
	names  bool

	wait, hold, renewal                     metric.Float64Histogram
	grants, contentions, losses, renewFails metric.Int64Counter
	held                                    metric.Int64UpDownCounter
}

var _ dlock.Hooks = (*Hooks)(nil)

// New returns Hooks configured by opts (nil: defaults), or an error if the
// MeterProvider refuses an instrument.
func New(opts *Options) (*Hooks, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	h := &Hooks{tracer: o.TracerProvider.Tracer(ScopeName), names: o.LockNames}
	m := o.MeterProvider.Meter(ScopeName)
	var err error
	hist := func(name, desc string, bounds []float64) metric.Float64Histogram {
		if err != nil {
			return nil
		}
		var x metric.Float64Histogram
		x, err = m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		return x
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var x metric.Int64Counter
		x, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return x
	}
	h.wait = hist("dlock.acquire.wait.duration", "How long acquires took until they returned, by outcome.",
		[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600})
	h.hold = hist("dlock.hold.duration", "How long leases were held, from grant to end, by how they ended.",
		[]float64{.01, .1, .5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400})
	h.renewal = hist("dlock.renewal.duration", "Latency of the backend calls that renew held leases (one call renews a batch).",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10})
	h.grants = counter("dlock.grants", "{lease}", "Leases granted (a MultiLease counts one per name).")
	h.contentions = counter("dlock.contentions", "{acquire}", "Acquires that found the lock held.")
	h.losses = counter("dlock.losses", "{lease}", "Leases lost before Unlock, by cause.")
	h.renewFails = counter("dlock.renewal.failures", "{renewal}", "Renewals that failed with their outcome unknown.")
	if err != nil {
		return nil, err
	}
	h.held, err = m.Int64UpDownCounter("dlock.leases.held", metric.WithUnit("{lease}"), metric.WithDescription("Leases held now."))
	if err != nil {
		return nil, err
	}
	return h, nil
}

// spanKey finds a Hooks' span in a context, apart from any other span there
// (another Hooks, a backend client's).
type spanKey struct{ h *Hooks }

// spanName names the span of an operation after the method called.
func spanName(op dlock.OpInfo) string {
	typ := "Mutex"
	switch op.Kind {
	case "read", "write":
		typ = "RWMutex"
	case "permit":
		typ = "Semaphore"
	case "multi":
		typ = "MultiMutex"
	}
	var method string
	switch op.Op {
	case "lock":
		method = "Lock"
	case "trylock":
		method = "TryLock"
	case "rlock":
		method = "RLock"
	case "tryrlock":
		method = "TryRLock"
	case "acquire":
		method = "Acquire"
	case "tryacquire":
		method = "TryAcquire"
	case "unlock":
		typ, method = "Lease", "Unlock"
	case "extend":
		typ, method = "Lease", "Extend"
	default:
		method = op.Op
	}
	return "dlock." + typ + "." + method
}

// token is a fencing token as an attribute: OpenTelemetry has no unsigned
// integers, and tokens above 2^63-1 are written as strings.
func token(t uint64) attribute.KeyValue {
	if t > math.MaxInt64 {
		return KeyToken.String(strconv.FormatUint(t, 10))
	}
	return KeyToken.Int64(int64(t))
}

// OpStart starts the operation's span.
func (h *Hooks) OpStart(ctx context.Context, op dlock.OpInfo) context.Context {
	attrs := []attribute.KeyValue{KeyBackend.String(op.Backend), KeyName.String(op.Name), KeyKind.String(op.Kind)}
	if op.Token != 0 {
		attrs = append(attrs, token(op.Token))
	}
	ctx, span := h.tracer.Start(ctx, spanName(op), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(op.Start), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, spanKey{h}, span)
}

// Attempt adds an "attempt" event to the operation's span.
func (h *Hooks) Attempt(ctx context.Context, _ dlock.OpInfo, a dlock.AttemptInfo) {
	span, ok := ctx.Value(spanKey{h}).(trace.Span)
	if !ok || !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{KeyAttempt.Int(a.N), KeyOutcome.String(string(a.Outcome)), KeyLatency.Float64(a.Latency.Seconds())}
	if a.HolderToken != 0 {
		attrs = append(attrs, KeyHolderToken.Int64(int64(min(a.HolderToken, math.MaxInt64))))
	}
	if a.RetryAfter > 0 {
		attrs = append(attrs, KeyRetryAfter.Float64(a.RetryAfter.Seconds()))
	}
	span.AddEvent("attempt", trace.WithAttributes(attrs...))
}

// OpEnd ends the operation's span, and records an acquire's wait and
// contention.
func (h *Hooks) OpEnd(ctx context.Context, op dlock.OpInfo, r dlock.OpResult) {
	if span, ok := ctx.Value(spanKey{h}).(trace.Span); ok {
		attrs := []attribute.KeyValue{KeyOutcome.String(string(r.Outcome))}
		if r.Token != 0 {
			attrs = append(attrs, token(r.Token))
		}
		if op.IsAcquire() {
			attrs = append(attrs, KeyAttempts.Int(r.Attempts), KeyContended.Bool(r.Contended))
		}
		span.SetAttributes(attrs...)
		if r.Outcome != dlock.OutcomeOK && r.Outcome != dlock.OutcomeLocked {
			if r.Err != nil {
				span.RecordError(r.Err)
			}
			span.SetStatus(codes.Error, string(r.Outcome))
		}
		span.End()
	}
	if !op.IsAcquire() {
		return
	}
	h.wait.Record(ctx, r.Duration.Seconds(), h.attrs(op.Backend, op.Kind, op.Name, KeyOutcome.String(string(r.Outcome))))
	if r.Contended {
		h.contentions.Add(ctx, 1, h.attrs(op.Backend, op.Kind, op.Name))
	}
}

// attrs is the metric attribute set backend, kind, extra, and name when
// names are on.
func (h *Hooks) attrs(backend, kind, name string, extra ...attribute.KeyValue) metric.MeasurementOption {
	kv := make([]attribute.KeyValue, 0, 4)
	kv = append(kv, KeyBackend.String(backend), KeyKind.String(kind))
	kv = append(kv, extra...)
	if h.names {
		kv = append(kv, KeyName.String(name))
	}
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}

// LeaseStart counts a grant and a lease held.
func (h *Hooks) LeaseStart(l dlock.LeaseInfo) {
	a := h.attrs(l.Backend, l.Kind, l.Name)
	h.grants.Add(context.Background(), 1, a)
	h.held.Add(context.Background(), 1, a)
}

// Renewal records a renewal call's latency (once per call) and a failure.
func (h *Hooks) Renewal(l dlock.LeaseInfo, r dlock.RenewalInfo) {
	ctx := context.Background()
	if r.Index == 0 {
		h.renewal.Record(ctx, r.Latency.Seconds(), metric.WithAttributeSet(attribute.NewSet(KeyBackend.String(l.Backend))))
	}
	if r.Outcome == dlock.OutcomeError {
		h.renewFails.Add(ctx, 1, h.attrs(l.Backend, l.Kind, l.Name))
	}
}

// LeaseEnd records the hold time, a loss, and one lease fewer held.
func (h *Hooks) LeaseEnd(l dlock.LeaseInfo, e dlock.LeaseEndInfo) {
	ctx := context.Background()
	h.held.Add(ctx, -1, h.attrs(l.Backend, l.Kind, l.Name))
	h.hold.Record(ctx, e.Held.Seconds(), h.attrs(l.Backend, l.Kind, l.Name, KeyOutcome.String(string(e.Outcome))))
	if e.Outcome == dlock.OutcomeLost {
		h.losses.Add(ctx, 1, h.attrs(l.Backend, l.Kind, l.Name, KeyCause.String(e.Cause)))
	}
}
