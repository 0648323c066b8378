package main

import (
	"context"
	"time"

	"github.com/dlock/dlock"
	"github.com/prometheus/client_golang/prometheus"
)

// The metrics "dlock serve" exports per lock. Every per-lock series has the
// labels name (the lock's name) and type (mutex, rwlock or semaphore): a
// name used as several lock types has one series per type. A value the
// backend does not know (a session-bound backend's expiry, the waiters of a
// backend that keeps no queue) is left out rather than exported as 0.
var (
	lockLabels = []string{"name", "type"}

	descUp = prometheus.NewDesc("dlock_inspect_up",
		"1 if the last listing of the backend's locks succeeded, 0 if it failed (the per-lock series are then absent).", nil, nil)
	descInspectSeconds = prometheus.NewDesc("dlock_inspect_duration_seconds",
		"How long the listing of the backend's locks took for this scrape.", nil, nil)
	descHeld = prometheus.NewDesc("dlock_lock_held",
		"1 if the lock is held (by a holder, readers or permit holders), else 0.", lockLabels, nil)
	descHolder = prometheus.NewDesc("dlock_lock_holder_info",
		"Always 1, for a lock held by a known owner: the owner label is the holder's owner id (a read/write lock's writer).", append(lockLabels, "owner"), nil)
	descToken = prometheus.NewDesc("dlock_lock_token",
		"The last fencing token granted for the lock (kept while it is free where the backend remembers it).", lockLabels, nil)
	descCount = prometheus.NewDesc("dlock_lock_holds",
		"The hold count as status reports it: 0 when free, more than 1 when the owner re-entered a mutex.", lockLabels, nil)
	descExpires = prometheus.NewDesc("dlock_lock_expires_in_seconds",
		"Time until the holder's lease ends if not renewed (the longest of several holders'), including any lock-delay the backend reports; absent when free or unknown.", lockLabels, nil)
	descWaiters = prometheus.NewDesc("dlock_lock_waiters",
		"Processes waiting for the lock; absent where the backend cannot tell.", lockLabels, nil)
	descReaders = prometheus.NewDesc("dlock_lock_readers",
		"A read/write lock's read holders.", lockLabels, nil)
	descPermits = prometheus.NewDesc("dlock_lock_permits",
		"A semaphore's size (its permit count).", lockLabels, nil)
	descPermitsTaken = prometheus.NewDesc("dlock_lock_permits_taken",
		"A semaphore's permits taken.", lockLabels, nil)
)

// lockCollector is a prometheus.Collector that lists the backend's locks
// at every scrape (Client.Inspect) and exports one set of series per lock.
type lockCollector struct {
	client *dlock.Client
	prefix string
}

func newLockCollector(c *dlock.Client, prefix string) *lockCollector {
	return &lockCollector{client: c, prefix: prefix}
}

// Describe sends the fixed descriptors.
func (c *lockCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descInspectSeconds, descHeld, descHolder, descToken, descCount,
		descExpires, descWaiters, descReaders, descPermits, descPermitsTaken} {
		ch <- d
	}
}

// Collect lists the locks and sends their series. A failed listing is
// dlock_inspect_up 0 and no per-lock series, not a failed scrape: the
// process's own metrics still reach Prometheus.
func (c *lockCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	start := time.Now()
	infos, err := c.client.Inspect(ctx, c.prefix)
	ch <- prometheus.MustNewConstMetric(descInspectSeconds, prometheus.GaugeValue, time.Since(start).Seconds())
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 1)
	for _, li := range infos {
		j := toJSON(li)
		labels := []string{li.Name, j.Type}
		gauge := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(labels, extra...)...)
		}
		h := held(li)
		gauge(descHeld, b2f(h))
		if li.Owner != "" {
			gauge(descHolder, 1, li.Owner)
		}
		gauge(descToken, float64(li.Token))
		gauge(descCount, float64(li.Count))
		if h && j.ExpiresInMS != nil {
			gauge(descExpires, float64(*j.ExpiresInMS)/1000)
		}
		if j.Waiters != nil {
			gauge(descWaiters, float64(*j.Waiters))
		}
		switch j.Type {
		case "rwlock":
			gauge(descReaders, float64(li.Readers))
		case "semaphore":
			gauge(descPermits, float64(li.Permits))
			gauge(descPermitsTaken, float64(li.Holders))
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// buildInfoCollector exports dlock_build_info{version, revision, goversion} 1.
func buildInfoCollector() prometheus.Collector {
	v := readBuildVersion()
	rev := v.Revision
	if rev != "" && v.Dirty {
		rev += "-modified"
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "dlock_build_info",
		Help:        "Always 1: the dlock binary's module version, VCS revision and Go version as labels.",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": rev, "goversion": v.GoVersion},
	}, func() float64 { return 1 })
}
