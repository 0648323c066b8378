// Package dlockprom exports what a dlock Client's locks do as Prometheus
// metrics, through github.com/prometheus/client_golang: how long acquires
// wait and leases are held (histograms), grants, contentions, losses by
// cause and renewal failures (counters), and the leases held now (a gauge).
//
// A *Metrics is both the Client's dlock.Hooks and a prometheus.Collector:
//
//	metrics := dlockprom.New(nil)
//	prometheus.MustRegister(metrics)
//	client, err := dlock.OpenWith(ctx, "redis://localhost:6379/0", &dlock.Options{Hooks: metrics})
//	...
//	http.Handle("/metrics", promhttp.Handler())
//
// Every metric is labelled by backend (Client.Backend: "redis", "etcd", …)
// and kind ("mutex", "read", "write", "permit", and "multi" for a MultiMutex
// as a whole), and, when Options.LockNames is set, by the lock's name: a
// series per name, so leave it off when names are unbounded (one per order
// or per user). docs/observability.md lists the metrics with example
// queries.
//
// One Metrics may serve several Clients (the series of Clients on the same
// backend add up); register it once per registry.
package dlockprom

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlock/dlock"
)

// Default histogram buckets, in seconds.
var (
	// DefaultWaitBuckets spans an uncontended round trip (1ms) to a long
	// wait behind a busy holder (10 minutes).
	DefaultWaitBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	// DefaultHoldBuckets spans a short critical section (10ms) to a day-long
	// job.
	DefaultHoldBuckets = []float64{.01, .1, .5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400}
	// DefaultRenewalBuckets spans a renewal's round trip.
	DefaultRenewalBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
)

// Options configure a Metrics. The zero value (or nil) takes every default.
type Options struct {
	// Namespace is the metric names' prefix; default "dlock" (so
	// dlock_grants_total).
	Namespace string
	// LockNames adds the label name (the lock's name) to every metric
	// but the renewal latency. Each distinct name is then its own set of
	// series: only for a bounded set of names.
	LockNames bool
	// ConstLabels are added to every metric (e.g. the service's role).
	ConstLabels prometheus.Labels
	// WaitBuckets, HoldBuckets and RenewalBuckets override the histogram
	// buckets (seconds) of dlock_acquire_wait_seconds, dlock_hold_seconds
	// and dlock_renewal_seconds; nil takes the defaults above.
	WaitBuckets, HoldBuckets, RenewalBuckets []float64
}

// Metrics is a dlock.Hooks that counts into Prometheus metrics, and the
// prometheus.Collector that exports them. It is safe for concurrent use;
// make one with New.
type Metrics struct {
	dlock.NopHooks
	names bool

	wait           *prometheus.HistogramVec // backend, kind, outcome[, name]
	hold           *prometheus.HistogramVec // backend, kind, outcome[, name]
	renewal        *prometheus.HistogramVec // backend
	grants         *prometheus.CounterVec   // backend, kind[, name]
	contentions    *prometheus.CounterVec   // backend, kind[, name]
	losses         *prometheus.CounterVec   // backend, kind, cause[, name]
	renewalFailure *prometheus.CounterVec   // backend, kind[, name]
	held           *prometheus.GaugeVec     // backend, kind[, name]
}

var (
	_ dlock.Hooks          = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New returns Metrics configured by opts (nil: defaults). Register it with
// a prometheus.Registerer and set it as the Client's Options.Hooks (or join
// it with others through dlock.JoinHooks).
func New(opts *Options) *Metrics {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Namespace == "" {
		o.Namespace = "dlock"
	}
	if o.WaitBuckets == nil {
		o.WaitBuckets = DefaultWaitBuckets
	}
	if o.HoldBuckets == nil {
		o.HoldBuckets = DefaultHoldBuckets
	}
	if o.RenewalBuckets == nil {
		o.RenewalBuckets = DefaultRenewalBuckets
	}
	labels := func(extra ...string) []string {
		l := append([]string{"backend", "kind"}, extra...)
		if o.LockNames {
			l = append(l, "name")
		}
		return l
	}
	m := &Metrics{names: o.LockNames}
	m.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.Namespace, Name: "acquire_wait_seconds", ConstLabels: o.ConstLabels, Buckets: o.WaitBuckets,
		Help: "How long acquires (Lock, TryLock, RLock, Acquire, ...) took until they returned, by outcome (ok: granted; locked: refused by TryLock; canceled: the context ended first; error, closed, invalid).",
	}, labels("outcome"))
	m.hold = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.Namespace, Name: "hold_seconds", ConstLabels: o.ConstLabels, Buckets: o.HoldBuckets,
		Help: "How long leases were held, from grant to end, by how they ended (released, lost, closed).",
	}, labels("outcome"))
	m.renewal = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.Namespace, Name: "renewal_seconds", ConstLabels: o.ConstLabels, Buckets: o.RenewalBuckets,
		Help: "Latency of the backend calls that renew held leases (one call renews a batch).",
	}, []string{"backend"})
	m.grants = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "grants_total", ConstLabels: o.ConstLabels,
		Help: "Leases granted (a MultiLease counts one per name).",
	}, labels())
	m.contentions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "contentions_total", ConstLabels: o.ConstLabels,
		Help: "Acquires that found the lock held: a TryLock refused, or a Lock that had to wait (not seen for waits inside an etcd or ZooKeeper queue).",
	}, labels())
	m.losses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "losses_total", ConstLabels: o.ConstLabels,
		Help: "Leases lost before Unlock, by cause (deadline: not confirmed by renewal in time; session: the backend session ended; not_held: the backend no longer had the grant; other).",
	}, labels("cause"))
	m.renewalFailure = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "renewal_failures_total", ConstLabels: o.ConstLabels,
		Help: "Renewals of a lease that failed with their outcome unknown (retried until the lease's validity deadline).",
	}, labels())
	m.held = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: o.Namespace, Name: "leases_held", ConstLabels: o.ConstLabels,
		Help: "Leases held now.",
	}, labels())
	return m
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.wait, m.hold, m.renewal, m.grants, m.contentions, m.losses, m.renewalFailure, m.held}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// values returns the label values backend, kind, extra…, and name when
// names are on.
func (m *Metrics) values(backend, kind, name string, extra ...string) []string {
	v := make([]string, 0, 4)
	v = append(v, backend, kind)
	v = append(v, extra...)
	if m.names {
		v = append(v, name)
	}
	return v
}

// OpEnd records an acquire's wait and contention.
func (m *Metrics) OpEnd(_ context.Context, op dlock.OpInfo, r dlock.OpResult) {
	if !op.IsAcquire() {
		return
	}
	m.wait.WithLabelValues(m.values(op.Backend, op.Kind, op.Name, string(r.Outcome))...).Observe(r.Duration.Seconds())
	if r.Contended {
		m.contentions.WithLabelValues(m.values(op.Backend, op.Kind, op.Name)...).Inc()
	}
}

// LeaseStart counts a grant and a lease held.
func (m *Metrics) LeaseStart(l dlock.LeaseInfo) {
	v := m.values(l.Backend, l.Kind, l.Name)
	m.grants.WithLabelValues(v...).Inc()
	m.held.WithLabelValues(v...).Inc()
}

// Renewal records a renewal call's latency (once per call) and a failure.
func (m *Metrics) Renewal(l dlock.LeaseInfo, r dlock.RenewalInfo) {
	if r.Index == 0 {
		m.renewal.WithLabelValues(l.Backend).Observe(r.Latency.Seconds())
	}
	if r.Outcome == dlock.OutcomeError {
		m.renewalFailure.WithLabelValues(m.values(l.Backend, l.Kind, l.Name)...).Inc()
	}
}

// LeaseEnd records the hold time, a loss, and one lease fewer held.
func (m *Metrics) LeaseEnd(l dlock.LeaseInfo, e dlock.LeaseEndInfo) {
	m.held.WithLabelValues(m.values(l.Backend, l.Kind, l.Name)...).Dec()
	m.hold.WithLabelValues(m.values(l.Backend, l.Kind, l.Name, string(e.Outcome))...).Observe(e.Held.Seconds())
	if e.Outcome == dlock.OutcomeLost {
		m.losses.WithLabelValues(m.values(l.Backend, l.Kind, l.Name, e.Cause)...).Inc()
	}
}
