package dlockprom_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlockprom"
	_ "github.com/dlock/dlock/memlock"
)

// Metrics are a Client's Hooks and a Collector: register them, open the
// Client with them, and serve the registry (promhttp.HandlerFor(reg, …)).
func Example() {
	metrics := dlockprom.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	client, err := dlock.OpenWith(context.Background(), "mem://example", &dlock.Options{Hooks: metrics})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
	lease, err := client.NewMutex("nightly", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_ = lease.Unlock(ctx)

	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "dlock_grants_total" || mf.GetName() == "dlock_leases_held" {
			m := mf.GetMetric()[0]
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			fmt.Printf("%s{%s} %v\n", mf.GetName(), strings.Join(labels, ","), v)
		}
	}
	// Output:
	// dlock_grants_total{backend="mem",kind="mutex"} 1
	// dlock_leases_held{backend="mem",kind="mutex"} 0
}
