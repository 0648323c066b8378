package etcdlock

import (
	"context"
	"time"
)

// Requests without a deadline.
//
// A gRPC request whose context has a deadline carries it to the server
// (grpc-timeout), and each side arms a timer of its own for it: on etcd 3.4
// over loopback that adds about 10µs to a Txn and a Delete, 4% of an
// uncontended Lock+Unlock (BenchmarkRequestDeadline). The dlock package
// gives every Unlock a deadline (its ReleaseTimeout), and callers often give
// Lock one. The driver's calls end when their context ends all the same, so
// it hides the deadline of the caller's context from the etcd client
// (rpcCtx): a request is cancelled at the deadline by the context's Done
// channel, as any cancelled request is, rather than also by the server's
// timer. A request the client gave up on may still be applied by the server,
// with or without a deadline; the driver already treats such an outcome as
// unknown.

// rpcCtx is ctx without its deadline, for requests to etcd: it ends when ctx
// ends, with ctx's error. A ctx without a deadline is returned as it is.
func rpcCtx(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); !ok {
		return ctx
	}
	if a, ok := ctx.(afterFuncer); ok {
		return noDeadlineAfter{noDeadline{ctx}, a}
	}
	return noDeadline{ctx}
}

// noDeadline is a context without a deadline that ends when its parent does
// (Done, Err and Value are the parent's).
type noDeadline struct{ context.Context }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// afterFuncer is a context that runs a function when it ends without a
// goroutine of its own (the dlock package's contexts are): the context
// package hangs a derived context on it with AfterFunc rather than start a
// goroutine to watch Done.
type afterFuncer interface {
	AfterFunc(func()) func() bool
}

// noDeadlineAfter is noDeadline for a parent that implements AfterFunc, which
// it passes on.
type noDeadlineAfter struct {
	noDeadline
	a afterFuncer
}

func (x noDeadlineAfter) AfterFunc(f func()) func() bool { return x.a.AfterFunc(f) }
