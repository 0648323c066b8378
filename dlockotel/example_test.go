package dlockotel_test

import (
	"context"
	"fmt"
	"log"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlockotel"
	_ "github.com/dlock/dlock/memlock"
)

// Each call is a span, a child of the span in the caller's context. Here
// the spans go to an in-memory exporter; a program passes its own
// providers (or sets the global ones, which New takes by default).
func Example() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	hooks, err := dlockotel.New(&dlockotel.Options{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	client, err := dlock.OpenWith(context.Background(), "mem://example", &dlock.Options{Hooks: hooks})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx, job := tp.Tracer("example").Start(context.Background(), "nightly-job")
	lease, err := client.NewMutex("nightly", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_ = lease.Unlock(ctx)
	job.End()

	for _, s := range spans.GetSpans() {
		fmt.Println(s.Name)
	}
	// Output:
	// dlock.Mutex.Lock
	// dlock.Lease.Unlock
	// nightly-job
}
