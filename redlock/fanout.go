package redlock

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/internal/redisscript"
)

// result is one node's answer to a fanned-out call.
type result[T any] struct {
	i   int
	v   T
	err error
}

// fanout runs fn on every node in parallel, each bounded by timeout, and
// returns a channel that receives the N results in the order they arrive.
// The calls are tracked, so Close waits for calls their caller stopped
// waiting for. It must be called only inside a call the gate admitted.
func fanout[T any](d *Driver, ctx context.Context, timeout time.Duration, fn func(ctx context.Context, n *node) (T, error)) <-chan result[T] {
	return fanoutTo(d, ctx, timeout, nil, fn)
}

// fanoutTo is fanout to the nodes listed (all nodes if which is nil).
func fanoutTo[T any](d *Driver, ctx context.Context, timeout time.Duration, which []int, fn func(ctx context.Context, n *node) (T, error)) <-chan result[T] {
	calls := len(which)
	if which == nil {
		calls = len(d.nodes)
	}
	out := make(chan result[T], calls)
	fanoutInto(d, ctx, timeout, which, fn, out)
	return out
}

// fanoutInto is fanoutTo sending the results to out, which must have room
// for them.
func fanoutInto[T any](d *Driver, ctx context.Context, timeout time.Duration, which []int, fn func(ctx context.Context, n *node) (T, error), out chan<- result[T]) {
	fanoutOn(d, ctx, timeout, which, fn, out, false, nil)
}

// fanoutOn is fanoutInto, with two options for a caller that waits for
// every node's answer anyway (a release). here runs the last node call on
// the calling goroutine (after handing the others to workers): one
// goroutine hand-off fewer; the acquire's fan-out returns on a quorum,
// which a node call on its goroutine would hold up. all, if not nil, is
// told of each result sent to out (see countdown).
func fanoutOn[T any](d *Driver, ctx context.Context, timeout time.Duration, which []int, fn func(ctx context.Context, n *node) (T, error), out chan<- result[T], here bool, all *countdown) {
	calls := len(which)
	if which == nil {
		calls = len(d.nodes)
	}
	if calls == 0 {
		return
	}
	d.gate.Add(calls)
	// One deadline for all the node calls (they start together). The
	// calls share one record, their context included, so that each
	// goroutine captures little.
	f := &fanCall[T]{d: d, ctx: ctx, timeout: timeout, fn: fn, out: out, all: all}
	f.nctx.Context, f.nctx.deadline = ctx, time.Now().Add(timeout)
	f.left.Store(int32(calls))
	last := calls - 1
	for k := range calls {
		i := k
		if which != nil {
			i = which[k]
		}
		if here && k == last {
			f.run(i)
		} else {
			d.startJob(job{call: f, i: i})
		}
	}
}

// job is one piece of work for a worker goroutine: fn, or call's call on
// node i. A node call is passed as its fan-out's record and the node's
// index, not as a closure, which would cost an allocation per node call.
type job struct {
	fn   func()
	call nodeCall
	i    int
}

// nodeCall is a fan-out's record (a *fanCall).
type nodeCall interface{ run(i int) }

func (j job) do() {
	if j.fn != nil {
		j.fn()
		return
	}
	j.call.run(j.i)
}

// spawn runs fn on a worker goroutine (see startJob).
func (d *Driver) spawn(fn func()) { d.startJob(job{fn: fn}) }

// startJob runs j on a goroutine: a worker left idle by an earlier node
// call if one is waiting, else a new one, which then stays for further
// node calls until it has been idle for workerIdle (or Close ends). A new
// goroutine starts on a small stack that a go-redis call grows, by copying,
// every time: ≈10% of the client's CPU in an uncontended Lock+Unlock.
func (d *Driver) startJob(j job) {
	select {
	case d.workers <- j:
	default:
		go d.work(j)
	}
}

// workerIdle is how long an idle worker waits for another node call.
const workerIdle = time.Second

// work runs j, and then the jobs startJob hands it.
func (d *Driver) work(j job) {
	var idle *time.Timer
	for {
		j.do()
		j = job{}
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case j = <-d.workers:
		case <-idle.C:
			return
		case <-d.stopWorkers:
			idle.Stop()
			return
		}
	}
}

// fanCall is one fan-out's shared state.
type fanCall[T any] struct {
	d       *Driver
	ctx     context.Context
	nctx    nodeCtx // the node calls' context: ctx, bounded by the node timeout
	timeout time.Duration
	fn      func(ctx context.Context, n *node) (T, error)
	out     chan<- result[T]
	all     *countdown   // if not nil, told of each result sent to out
	left    atomic.Int32 // calls still running; the last stops nctx
}

// countdown is closed once as many results as it was made for were sent:
// a caller that needs every node's answer waits for it, and is woken once,
// rather than once per answer that finds it waiting.
type countdown struct {
	left atomic.Int32
	done chan struct{}
	// then, if set (under mu, by settle), is run by each node call after
	// it sent its result (under mu), on that call's goroutine: it takes
	// one result.
	mu   sync.Mutex
	then func()
}

func newCountdown(n int) *countdown {
	c := &countdown{done: make(chan struct{})}
	c.left.Store(int32(n))
	return c
}

// sent counts one result down.
func (c *countdown) sent() {
	if c.left.Add(-1) == 0 {
		close(c.done)
	}
}

// run is the call on node i.
func (f *fanCall[T]) run(i int) {
	defer f.d.gate.Done()
	v, err := f.fn(&f.nctx, f.d.nodes[i])
	// A late answer still counts: validity is measured by the
	// dlock package, from the send.
	if err != nil && f.nctx.Err() != nil && f.ctx.Err() == nil {
		err = fmt.Errorf("no answer within the %v node timeout: %w", f.timeout, err)
	}
	if f.left.Add(-1) == 0 {
		f.nctx.stop()
	}
	r := result[T]{i: i, v: v, err: err}
	a := f.all
	if a == nil {
		f.out <- r
		return
	}
	a.mu.Lock()
	f.out <- r
	then := a.then
	a.mu.Unlock()
	a.sent()
	if then != nil {
		then()
	}
}

// nodeCtx is the context of a fan-out's node calls:
// context.WithDeadline(Context, deadline), made lazily. What bounds a node
// call is its deadline: go-redis (ContextTimeoutEnabled) sets every
// command's connection deadlines from Deadline, and nothing on a node
// call's usual path (a script call on the node's lane, or on a pooled
// connection with a pool turn free) asks for Done. So the timer context
// behind Done (inner) is made only when something does ask, as go-redis
// does when it waits for a pool turn or a dial, which then ends at the
// node timeout as before. Until then no timer is armed (arming one earlier
// than the runtime's next one wakes its network poller, and stopping it
// takes the timer heap's lock), and the fan-out's ctx is not asked for its
// Done either: the dlock package makes its Lock's and Unlock's contexts'
// cancel machinery (a context, an AfterFunc, a timer) only when a driver
// asks for Done, which context.WithTimeout(ctx, …) always did.
//
// Err reports DeadlineExceeded once the deadline has passed and Canceled
// once the fan-out's calls have all ended (stop), as the timer context
// would; Value answers from inner once it exists, so that a context
// derived from a nodeCtx is registered with inner's cancelCtx rather than
// watched by a goroutine of the context package.
type nodeCtx struct {
	context.Context // the fan-out's ctx
	deadline        time.Time

	mu      sync.Mutex
	inner   context.Context    // WithDeadline(Context, deadline), made by the first Done
	cancel  context.CancelFunc // inner's
	ready   atomic.Bool        // inner is set (read without mu)
	stopped atomic.Bool        // stop was called
}

// Deadline is the node deadline, or ctx's if that is earlier.
func (x *nodeCtx) Deadline() (time.Time, bool) {
	if d, ok := x.Context.Deadline(); ok && d.Before(x.deadline) {
		return d, true
	}
	return x.deadline, true
}

// innerCtx returns inner, making it if need be (ended already if x was
// stopped).
func (x *nodeCtx) innerCtx() context.Context {
	if x.ready.Load() {
		return x.inner
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.inner == nil {
		x.inner, x.cancel = context.WithDeadline(x.Context, x.deadline)
		if x.stopped.Load() {
			x.cancel()
		}
		x.ready.Store(true)
	}
	return x.inner
}

func (x *nodeCtx) Done() <-chan struct{} { return x.innerCtx().Done() }

func (x *nodeCtx) Err() error {
	if x.ready.Load() {
		return x.inner.Err()
	}
	if err := x.Context.Err(); err != nil {
		return err
	}
	if x.stopped.Load() {
		return context.Canceled
	}
	// time.Until reads only the monotonic clock.
	if time.Until(x.deadline) <= 0 {
		return context.DeadlineExceeded
	}
	return nil
}

func (x *nodeCtx) Value(key any) any {
	if x.ready.Load() {
		return x.inner.Value(key)
	}
	return x.Context.Value(key)
}

// stop ends x (Canceled) if it has not ended, and lets go of inner's
// timer if it was made.
func (x *nodeCtx) stop() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.stopped.Store(true)
	if x.inner != nil {
		x.cancel()
	}
}

// stagger is how a woken waiter's attempt reaches the nodes: at once on
// first, the nodes whose release named it (each free, with the waiter
// first in its queue, so each grants it), and on every other node as soon
// as its release names the waiter too (w's bits), all of them once a
// quorum has been sent to, and all of them anyway after the node timeout
// (at most maxStagger).
// Each node's acquire thus leaves as soon as that node is known to be free,
// rather than all of them at the quorum-th release: the hand-off is that
// much shorter, and no acquire reaches a node before its release.
type stagger struct {
	first uint64 // nodes to send to at once (fewer than a quorum)
	w     *waiter
}

// lateCalls are a staggered attempt's node calls.
type lateCalls struct {
	out      chan result[redisscript.AcquireResult]
	late     uint64 // nodes not sent to yet
	w        *waiter
	launched time.Time   // when the first nodes were sent to
	timer    *time.Timer // sends to the late nodes when it fires
}

// launchEarly sends st's attempt to st.first, and returns what sends the
// rest.
func (d *Driver) launchEarly(ctx context.Context, ops *lockOps, timeout time.Duration, st *stagger) *lateCalls {
	all := uint64(1)<<len(d.nodes) - 1
	l := &lateCalls{out: make(chan result[redisscript.AcquireResult], len(d.nodes)), late: all &^ st.first, w: st.w, launched: time.Now()}
	fanoutInto(d, ctx, timeout, nodesOf(st.first), ops.acquire, l.out)
	l.timer = time.NewTimer(min(timeout, maxStagger))
	return l
}

// firstAnswer is told that the attempt's first answer came back, a round
// trip after the launch. The releases that free the late nodes left with
// the one that named the waiter, so they name it within about as long
// again (restWindow): a late node whose release has not by then granted
// or named another waiter (the nodes' queues disagreed) is sent the
// attempt then, rather than after the node timeout (maxStagger).
func (l *lateCalls) firstAnswer(timeout time.Duration) {
	if l.late != 0 {
		l.timer.Reset(restWindow(time.Since(l.launched), min(timeout, maxStagger)))
	}
}

// maxStagger bounds how long a staggered attempt waits for the releases of
// its late nodes before it sends to them anyway: meanwhile the waiter does
// not renew its queue entries (which last queueWait).
const maxStagger = queueWait / 6

// next returns the next node's answer, sending to the late nodes as they
// become free (or all of them once a quorum was sent to, or the node
// timeout passed, or ctx ended, or Close began).
func (l *lateCalls) next(d *Driver, ctx context.Context, ops *lockOps, timeout time.Duration) result[redisscript.AcquireResult] {
	for l.late != 0 {
		select {
		case r := <-l.out:
			return r
		case <-l.w.sig:
			m := l.w.nodes.Swap(0) & l.late
			all := uint64(1)<<len(d.nodes) - 1
			if sent := all &^ (l.late &^ m); bits.OnesCount64(sent) >= d.quorum {
				m = l.late
			}
			if m != 0 {
				l.late &^= m
				fanoutInto(d, ctx, timeout, nodesOf(m), ops.acquire, l.out)
			}
		case <-l.timer.C:
			l.launchRest(d, ctx, ops, timeout)
		case <-ctx.Done():
			l.launchRest(d, ctx, ops, timeout)
		case <-d.closing:
			l.launchRest(d, ctx, ops, timeout)
		}
	}
	l.timer.Stop()
	return <-l.out
}

// launchRest sends to every node not sent to yet.
func (l *lateCalls) launchRest(d *Driver, ctx context.Context, ops *lockOps, timeout time.Duration) {
	if l.late != 0 {
		fanoutInto(d, ctx, timeout, nodesOf(l.late), ops.acquire, l.out)
		l.late = 0
	}
	l.timer.Stop()
}

// nodesOf lists the nodes whose bits are set in m.
func nodesOf(m uint64) []int {
	var which []int
	for m != 0 {
		i := bits.TrailingZeros64(m)
		which = append(which, i)
		m &^= 1 << i
	}
	return which
}

// settle sets h.settled while the nodes that had not answered an acquire
// that returned early (on a quorum, got being the answers so far) answer;
// what waits for a node's answer (a release, see settling.after) runs
// as it arrives, and h.settled is dropped after the last. It must be called
// inside an admitted call; Close waits for it. A queued waiter
// (ops.isQueued()) leaves the queue of the late nodes that did not grant.
//
// With sink, the countdown of every node call sending to results (the
// attempt's fan-out), the late answers are handled by the node calls that
// bring them, on their own goroutines (sink.then): a release waiting for
// one runs there at once, without a hand-off. Without it (a staggered
// attempt's calls), a goroutine waits for them.
func (d *Driver) settle(ctx context.Context, h *handle, ops *lockOps, timeout time.Duration, results <-chan result[redisscript.AcquireResult], got []result[redisscript.AcquireResult], sink *countdown) {
	if sink != nil {
		sink.mu.Lock()
		defer sink.mu.Unlock()
	}
	// The answers that came in meanwhile need no one to wait for them
	// (nor a release to wait for settle).
	var leave []int
drain:
	for len(got) < len(d.nodes) {
		select {
		case r := <-results:
			got = append(got, r)
			if r.err != nil || !r.v.Granted {
				leave = append(leave, r.i)
			}
		default:
			break drain
		}
	}
	pending := len(d.nodes) - len(got)
	if pending == 0 {
		if ops.isQueued() && len(leave) > 0 {
			d.gate.Add(1)
			d.spawn(func() {
				defer d.gate.Done()
				d.leaveNodes(ctx, ops, leave, timeout)
			})
		}
		return
	}
	s := &settling{pending: make([]bool, len(d.nodes)), then: make([][]func(int, bool), len(d.nodes))}
	for i := range s.pending {
		s.pending[i] = true
	}
	for _, r := range got {
		s.pending[r.i] = false
	}
	h.settled.Store(s)
	d.gate.Add(1)
	var mu sync.Mutex // guards left and leave
	left := pending
	// answer handles one late answer; run is whether what waited for it
	// may run on this goroutine (else it is handed to a worker).
	answer := func(r result[redisscript.AcquireResult], run bool) {
		mu.Lock()
		left--
		last := left == 0
		if r.err != nil || !r.v.Granted {
			leave = append(leave, r.i)
		}
		mu.Unlock()
		if last {
			h.settled.Store(nil)
		}
		for _, f := range s.answered(r.i) {
			f(r.i, run || last)
		}
		if last {
			if ops.isQueued() && len(leave) > 0 {
				d.leaveNodes(ctx, ops, leave, timeout)
			}
			d.gate.Done()
		}
	}
	if sink != nil {
		sink.then = func() { answer(<-results, true) }
		return
	}
	d.spawn(func() {
		for range pending {
			answer(<-results, false)
		}
	})
}
