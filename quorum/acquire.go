package quorum

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// handle is the driver's Grant.Handle: what each node granted.
type handle struct {
	token uint64 // the lease's token

	mu sync.Mutex
	// nodes[i] is node i's part of the grant: set when node i granted
	// (held) or its reply was lost (unknown), including answers that came
	// after the grant was returned.
	nodes    []nodePart
	released bool // Release ran: a late grant is undone at once
	// end is closed when the lease is released or found gone: its loss
	// watch stops.
	end     chan struct{}
	endOnce sync.Once
	// expires is when the lease lapses unless renewed: the loss watch
	// stops then too.
	expires time.Time
	// latePending is set while lateAnswers still waits for nodes; lateEnd,
	// when the lease is released meanwhile, ends the lateUndos entry that
	// makes the owner's next attempt wait for them (a late failure is
	// released by owner alone).
	latePending bool
	lateEnd     func()
}

type nodePart struct {
	held    bool
	unknown bool // the acquire's reply was lost: it may be held
	refused bool // the node answered without granting
	grant   driver.Grant
}

func (h *handle) finish() { h.endOnce.Do(func() { close(h.end) }) }

// answer is one node's reply to an acquire.
type answer struct {
	done  bool // replied (or gave up)
	grant driver.Grant
	err   error
}

func (a answer) granted() bool { return a.done && a.err == nil }

// maybeHeld reports whether the node may hold the attempt's grant: it
// granted it, or its reply was lost.
func (a answer) maybeHeld() bool { return a.done && (a.err == nil || !definite(a.err)) }

func (a answer) refused() bool { return a.done && errors.Is(a.err, driver.ErrLocked) }

// TryAcquire takes the lock on a majority of nodes (see the package doc).
// Grant.Sent is when the requests were sent (or earlier, when a node counts
// its lease from an earlier confirmation), Grant.TTL the shortest TTL a
// granting node reports; the dlock package keeps the validity deadline and
// releases a grant that arrives after it. A node's ErrInvalid or
// ErrUnsupported (a semaphore's permit count differing from the stored
// one, a lock-delay the backend cannot honour) fails the attempt with that
// error unless a majority granted.
//
// After Close has begun it fails with an error wrapping dlock.ErrClosed; a
// grant that completes while Close runs is undone on every node, not
// returned.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if !d.gate.enter() {
		return driver.Grant{}, errClosed
	}
	defer d.gate.exit()
	for try := 1; ; try++ {
		g, again, err := d.attempt(ctx, req)
		if !again {
			return g, err
		}
		if try == maxTries || ctx.Err() != nil {
			return driver.Grant{}, &driver.LockedError{RetryAfter: time.Millisecond}
		}
	}
}

// maxTries bounds the attempts of one TryAcquire that found and cleared
// leftover grants of its own owner, or waited for its driver's stragglers
// (see attempt).
const maxTries = 3

// attempt is one round of the quorum acquire. again reports that the
// caller is to try again afresh, in two cases. A majority granted, but
// fewer than a majority of nodes re-entered a grant of the same owner: the
// owner holds no live lease, and the holds it has on some nodes are
// leftovers of an attempt whose undo never reached them. A re-entry
// reports the token of that old grant, which may be lower than grants made
// since on other nodes; attempt then releases everything it got and clears
// the leftovers. Or a majority would have granted but for nodes that
// refused while this driver's own earlier requests were on their way there
// (see stragglers); attempt then waits until enough of those are done.
func (d *Driver) attempt(ctx context.Context, req driver.AcquireRequest) (driver.Grant, bool, error) {
	if err := ctx.Err(); err != nil {
		// The node calls below outlive ctx (and are waited for when it
		// ends): on a done ctx, send nothing.
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "quorum: acquire", err)
	}
	if err := d.late.await(ctx, req); err != nil {
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "quorum: acquire", err)
	}
	k := nameKind{req.Name, req.Kind}
	straggled := d.strag.nodes(k)
	start := time.Now()
	timeout := d.timeoutFor(req.TTL)
	n := len(d.nodes)
	// The node calls are bounded by the node timeout, not by ctx: a call
	// still running when the attempt ends (ctx done, a majority decided)
	// runs to its end and is handled in the background, so that a late
	// grant joins the lease or is undone, never left behind.
	results := fanout(d, context.WithoutCancel(ctx), timeout, nil, func(ctx context.Context, _ int, nd driver.Driver) (driver.Grant, error) {
		return nd.TryAcquire(ctx, req)
	})
	ans := make([]answer, n)
	got, granted, refused, failed := 0, 0, 0, 0
	reentered := false
	take := func(r result[driver.Grant]) {
		got++
		ans[r.i] = answer{done: true, grant: r.v, err: r.err}
		switch {
		case r.err == nil:
			granted++
			reentered = reentered || r.v.Count > 1
		case errors.Is(r.err, driver.ErrLocked):
			refused++
		default:
			failed++
		}
	}
collect:
	for got < n && granted < d.quorum && refused+failed <= n-d.quorum {
		select {
		case r := <-results:
			take(r)
		case <-ctx.Done():
			break collect
		}
	}
	if granted < d.quorum && ctx.Err() != nil && refused+failed <= n-d.quorum {
		// The caller gave up with requests still on their way: wait for
		// their answers (each bounded by the node timeout) and undo what
		// they granted before returning, so that nothing is left behind
		// once the call returns. Undone in the background instead, a
		// request delayed past the holder's release would be granted after
		// the caller had gone and keep the lock from the next taker until
		// the undo got there.
		for got < n {
			take(<-results)
		}
		d.undo(ctx, req, ans)
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "quorum: acquire", fmt.Errorf("%d of %d nodes granted, a quorum is %d", granted, n, d.quorum))
	}
	if granted < d.quorum {
		stale := d.strag.refusing(k, ans, straggled)
		if len(stale) > 0 && granted+len(stale)+n-got >= d.quorum {
			// Some refusals came from nodes with this driver's own
			// earlier requests on their way (stragglers), and a
			// majority could have granted without them, depending on
			// the nodes yet to answer: hear those (each within the node
			// timeout). Only then does an attempt wait for a hung node
			// here.
			for got < n {
				take(<-results)
			}
		}
		// Nodes still answering are undone when they answer, in the
		// background: a hung node does not slow every refusal down.
		d.undo(ctx, req, ans)
		d.undoLate(req, results, ans)
		if need := d.quorum - granted; len(stale) > 0 && len(stale) >= need {
			// Without the stragglers, a majority would have granted:
			// try again once enough of them are done.
			if err := d.strag.await(ctx, k, stale, need); err != nil {
				return driver.Grant{}, false, ctxerr.Wrap(ctx, "quorum: acquire", err)
			}
			return driver.Grant{}, true, nil
		}
		return driver.Grant{}, false, d.refusal(ctx, req, ans, time.Since(start))
	}
	if reentered {
		// A re-entry is judged on every node's answer.
		for got < n {
			take(<-results)
		}
	} else if got < n {
		// The token is the largest among the granting nodes: give the
		// others as long again as the majority took, so that the token
		// (and Inspect) usually covers every node. Later answers are
		// handled in the background.
		grace := time.NewTimer(max(time.Since(start), 2*time.Millisecond))
	wait:
		for got < n {
			select {
			case r := <-results:
				take(r)
			case <-grace.C:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		grace.Stop()
	}
	var (
		token uint64
		count int
	)
	if reentered {
		var live bool
		token, count, live = d.liveReentry(req, ans)
		if !live {
			d.undo(ctx, req, ans)
			d.clearLeftovers(ctx, req, ans)
			return driver.Grant{}, true, nil
		}
	} else {
		for _, a := range ans {
			if a.granted() {
				token = max(token, a.grant.Token)
			}
		}
		count = 1
	}
	h := &handle{token: token, nodes: make([]nodePart, n), end: make(chan struct{})}
	for i, a := range ans {
		switch {
		case a.granted():
			h.nodes[i] = nodePart{held: true, grant: a.grant}
		case a.maybeHeld():
			h.nodes[i].unknown = true
		case a.done:
			h.nodes[i].refused = true
		}
	}
	if err := d.raise(ctx, req, token, ans, timeout); err != nil {
		d.lateAnswers(req, h, results, n-got, token, timeout)
		d.releaseAll(ctx, req, h)
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "quorum: acquire", err)
	}
	d.lateAnswers(req, h, results, n-got, token, timeout)
	if d.gate.isStopped() {
		d.releaseAll(ctx, req, h)
		return driver.Grant{}, false, fmt.Errorf("quorum: acquire: granted while closing, undone: %w", dlock.ErrClosed)
	}
	g := driver.Grant{Token: token, Count: count, Sent: start, Handle: h}
	var tokens []uint64
	for _, a := range ans {
		tokens = append(tokens, 0)
		if !a.granted() {
			continue
		}
		tokens[len(tokens)-1] = a.grant.Token
		if s := a.grant.Sent; !s.IsZero() && s.Before(g.Sent) {
			g.Sent = s
		}
		ttl := a.grant.TTL
		if ttl == 0 {
			ttl = req.TTL
		}
		if g.TTL == 0 || ttl < g.TTL {
			g.TTL = ttl
		}
	}
	if g.TTL == req.TTL {
		g.TTL = 0
	}
	h.expires = g.Sent.Add(max(g.TTL, req.TTL))
	d.recs.put(req, token, tokens, h.expires)
	g.Lost, g.Cause = d.watchLoss(h)
	return g, false, nil
}

// liveReentry reports whether the re-entries among the answers are those
// of a live lease: a majority of nodes re-entered. It returns the lease's
// token (as recorded when it was granted, or else the largest token among
// the re-entered nodes, which is the lease's own when the node that gave it
// is among them) and the hold count.
func (d *Driver) liveReentry(req driver.AcquireRequest, ans []answer) (token uint64, count int, live bool) {
	re := 0
	tokens := make([]uint64, len(ans))
	for i, a := range ans {
		if a.granted() && a.grant.Count > 1 {
			re++
			tokens[i] = a.grant.Token
			token = max(token, a.grant.Token)
			count = max(count, a.grant.Count)
		}
	}
	if re < d.quorum {
		return 0, 0, false
	}
	if t, ok := d.recs.match(req, tokens); ok {
		token = t
	}
	return token, count, true
}

// raise makes sure a majority of the granting nodes have a counter of at
// least token before the grant is returned: granting nodes whose own token
// is the token have it already; the others are raised, and raise waits
// until enough of them confirmed. The rest, and every other node that
// answered (a refusal, a lost reply), are raised in the background, as late
// answers are (see lateAnswers): their counters matter only after a node
// loses its own (see docs/quorum.md).
func (d *Driver) raise(ctx context.Context, req driver.AcquireRequest, token uint64, ans []answer, timeout time.Duration) error {
	have := 0
	var wait, background []int
	for i, a := range ans {
		switch {
		case !a.done:
			// lateAnswers raises it once it answers.
		case a.granted() && a.grant.Token >= token:
			have++
		case a.granted():
			wait = append(wait, i)
		default:
			background = append(background, i)
		}
	}
	raiseTo := func(ctx context.Context, _ int, nd driver.Driver) (struct{}, error) {
		return struct{}{}, nd.(driver.FenceRaiser).RaiseFence(ctx, req.Name, req.Kind, token)
	}
	if len(background) > 0 {
		_ = fanout(d, context.WithoutCancel(ctx), timeout, background, raiseTo)
	}
	if len(wait) == 0 {
		return nil
	}
	results := fanout(d, context.WithoutCancel(ctx), timeout, wait, raiseTo)
	var firstErr error
	// Wait only until a majority of the granting nodes has the token; the
	// other raises finish in the background.
	for k := 0; k < len(wait) && have < d.quorum; k++ {
		var r result[struct{}]
		select {
		case r = <-results:
		case <-ctx.Done():
			return fmt.Errorf("fencing token %d reached %d granting nodes of %d, a quorum is %d: %w", token, have, len(d.nodes), d.quorum, ctx.Err())
		}
		switch {
		case r.err == nil:
			have++
		case firstErr == nil:
			firstErr = r.err
		}
	}
	if have < d.quorum {
		return fmt.Errorf("fencing token %d reached %d granting nodes of %d, a quorum is %d: %w", token, have, len(d.nodes), d.quorum, firstErr)
	}
	return nil
}

// lateAnswers handles, in the background, the answers of the nodes that
// had not answered when the grant was decided: a late grant joins the lease,
// or is released at once if the lease was released meanwhile (as is a late
// failure, whose grant may exist), and a node that did not grant at the
// token has its counter raised to it. A late failure's release goes by
// owner alone: when the lease is released before every node answered, the
// owner's next attempt waits for this work (see lateUndos and release).
func (d *Driver) lateAnswers(req driver.AcquireRequest, h *handle, results <-chan result[driver.Grant], pending int, token uint64, timeout time.Duration) {
	if pending == 0 {
		return
	}
	h.mu.Lock()
	h.latePending = true
	h.mu.Unlock()
	d.gate.spawn(func() {
		defer func() {
			h.mu.Lock()
			h.latePending = false
			end := h.lateEnd
			h.lateEnd = nil
			h.mu.Unlock()
			if end != nil {
				end()
			}
		}()
		ctx := context.Background()
		for range pending {
			r := <-results
			h.mu.Lock()
			released := h.released
			if !released {
				switch {
				case r.err == nil:
					h.nodes[r.i] = nodePart{held: true, grant: r.v}
				case !definite(r.err):
					h.nodes[r.i].unknown = true
				default:
					h.nodes[r.i].refused = true
				}
			}
			h.mu.Unlock()
			nd := d.nodes[r.i].d
			if released && (r.err == nil || !definite(r.err)) {
				rctx, cancel := context.WithTimeout(ctx, timeout)
				_, _ = nd.Release(rctx, nodeLease(req, r.v)) // Token 0 for a failure: by owner
				cancel()
				continue
			}
			if r.err == nil && r.v.Token >= token {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, timeout)
			_ = nd.(driver.FenceRaiser).RaiseFence(rctx, req.Name, req.Kind, token)
			cancel()
		}
	})
}

// nodeLease is the driver.Lease of node grant g of req.
func nodeLease(req driver.AcquireRequest, g driver.Grant) driver.Lease {
	return driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: req.TTL, LockDelay: req.LockDelay, Kind: req.Kind, Permits: req.Permits}
}

// undo releases one hold of a failed attempt on every node that granted it
// or may have (its reply was lost), among the nodes that answered; the
// others are left to undoLate, so that no release overtakes its acquire.
func (d *Driver) undo(ctx context.Context, req driver.AcquireRequest, ans []answer) {
	var which []int
	for i, a := range ans {
		if a.maybeHeld() {
			which = append(which, i)
		}
	}
	if len(which) == 0 {
		return
	}
	results := fanout(d, context.WithoutCancel(ctx), d.timeoutFor(req.TTL), which, func(ctx context.Context, i int, nd driver.Driver) (int, error) {
		l := nodeLease(req, driver.Grant{})
		if a := ans[i]; a.granted() {
			l = nodeLease(req, a.grant)
		}
		return nd.Release(ctx, l)
	})
	for range which {
		<-results
	}
}

// undoLate releases, in the background, one hold of a failed attempt on
// each of the nodes that had not answered (ans), once it answers and grants
// it or may have. A node whose answer is lost is released by owner alone
// (token 0): the next attempt of the same owner waits for that (see
// lateUndos), or the release could take away the grant that attempt gets
// there. Until a node's request is done, the next attempts on the name
// count it as taken (see stragglers).
func (d *Driver) undoLate(req driver.AcquireRequest, results <-chan result[driver.Grant], ans []answer) {
	var pending []int
	for i, a := range ans {
		if !a.done {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		return
	}
	done := d.late.begin(keyOf(req))
	nodeDone := d.strag.begin(nameKind{req.Name, req.Kind}, pending)
	d.gate.spawn(func() {
		defer done()
		for range pending {
			r := <-results
			if r.err == nil || !definite(r.err) {
				ctx, cancel := context.WithTimeout(context.Background(), d.timeoutFor(req.TTL))
				_, _ = d.nodes[r.i].d.Release(ctx, nodeLease(req, r.v))
				cancel()
			}
			nodeDone(r.i)
		}
	})
}

// clearLeftovers releases, after undo released this attempt's own hold,
// the holds left before it on nodes that answered with a re-entry: the
// owner's lease is not live (see attempt), so they are a dead attempt's
// remains, and the next attempt must find the nodes free.
func (d *Driver) clearLeftovers(ctx context.Context, req driver.AcquireRequest, ans []answer) {
	var which []int
	for i, a := range ans {
		if a.granted() && a.grant.Count > 1 {
			which = append(which, i)
		}
	}
	results := fanout(d, context.WithoutCancel(ctx), d.timeoutFor(req.TTL), which, func(ctx context.Context, i int, nd driver.Driver) (struct{}, error) {
		for range ans[i].grant.Count - 1 {
			left, err := nd.Release(ctx, nodeLease(req, ans[i].grant))
			if err != nil || left == 0 {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	})
	for range which {
		<-results
	}
}

// releaseAll releases a grant that will not be returned (its fence raise
// failed, or Close began) on every node that granted or may have; late
// answers are released as they come (see lateAnswers).
func (d *Driver) releaseAll(ctx context.Context, req driver.AcquireRequest, h *handle) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*d.timeoutFor(req.TTL))
	defer cancel()
	_, _ = d.release(rctx, nodeLeaseOf(req), h)
}

func nodeLeaseOf(req driver.AcquireRequest) driver.Lease {
	return driver.Lease{Name: req.Name, Owner: req.Owner, TTL: req.TTL, LockDelay: req.LockDelay, Kind: req.Kind, Permits: req.Permits}
}

// refusal is the error of an attempt that a majority did not grant: a
// node's own refusal of the request as bad (ErrInvalid, ErrUnsupported), an
// error when more than N − majority nodes failed (or none refused), or else a
// *driver.LockedError with a retry hint.
func (d *Driver) refusal(ctx context.Context, req driver.AcquireRequest, ans []answer, took time.Duration) error {
	answered, refused, pending := 0, 0, 0
	var firstErr, badErr error
	var token uint64
	for _, a := range ans {
		switch {
		case !a.done:
			// Still answering: undone in the background (undoLate).
			pending++
		case a.err == nil:
			answered++
		case errors.Is(a.err, driver.ErrLocked):
			answered++
			refused++
			var le *driver.LockedError
			if errors.As(a.err, &le) {
				token = max(token, le.Token)
			}
		case errors.Is(a.err, driver.ErrInvalid) || errors.Is(a.err, driver.ErrUnsupported):
			if badErr == nil {
				badErr = a.err
			}
		case firstErr == nil:
			firstErr = a.err
		}
	}
	if badErr != nil {
		return fmt.Errorf("quorum: acquire: %w", badErr)
	}
	// Too many nodes failed for a majority to grant whatever the others
	// said: an error. Otherwise a refusal kept the majority out: held.
	n := len(d.nodes)
	if failed := n - answered - pending; failed > n-d.quorum || refused == 0 {
		return ctxerr.Wrap(ctx, "quorum: acquire", fmt.Errorf("%d of %d nodes failed, a quorum is %d: %w", failed, n, d.quorum, firstErr))
	}
	return &driver.LockedError{RetryAfter: d.retryAfter(ans, took), Token: token}
}

// retryAfter estimates when a majority of nodes could be free. When a
// majority refused, it is the time until the majority-th earliest node is
// free: the nodes this attempt got are free at once (it released them),
// refusing nodes when their holder's lease runs out as they reported it. When
// fewer refused, the vote was split among contenders that have all released
// by now: retry after a random delay of one to four times what this attempt
// took, so that they do not collide again.
func (d *Driver) retryAfter(ans []answer, took time.Duration) time.Duration {
	var free []time.Duration
	refused := 0
	for _, a := range ans {
		switch {
		case a.granted():
			free = append(free, 0)
		case a.refused():
			refused++
			var le *driver.LockedError
			if errors.As(a.err, &le) && le.RetryAfter > 0 {
				free = append(free, le.RetryAfter)
			} else {
				free = append(free, unknown)
			}
		}
	}
	if refused < d.quorum {
		took = max(took, 100*time.Microsecond)
		return took + rand.N(3*took)
	}
	slices.Sort(free)
	if len(free) < d.quorum || free[d.quorum-1] == unknown {
		return 0
	}
	return free[d.quorum-1]
}

// unknown stands for a refusing node's unknown free time.
const unknown = time.Duration(math.MaxInt64)

// lateUndos tracks, by name, kind and owner, the releases by owner alone
// (token 0) that may still reach a node: undoLate's, a released lease's
// late answers (lateAnswers) and a Release's that outlive the call
// (release), so that the owner's next attempt on that lock waits for them.
// Such a release, sent for a node whose answer was lost, would otherwise
// take away the grant the next attempt gets on that node, and with it,
// silently, part of the new lease's majority. The wait is bounded by two
// node timeouts (the answer, then the release).
type lateUndos struct {
	mu sync.Mutex
	m  map[lateKey]*lateUndo
}

type lateKey struct {
	name, owner string
	kind        driver.Kind
}

type lateUndo struct {
	n    int           // undoLate calls in flight
	done chan struct{} // closed when n drops to 0
}

func keyOf(req driver.AcquireRequest) lateKey { return lateKey{req.Name, req.Owner, req.Kind} }

// begin records work in flight for key k and returns the function that
// ends it.
func (u *lateUndos) begin(k lateKey) func() {
	u.mu.Lock()
	if u.m == nil {
		u.m = map[lateKey]*lateUndo{}
	}
	e := u.m[k]
	if e == nil {
		e = &lateUndo{done: make(chan struct{})}
		u.m[k] = e
	}
	e.n++
	u.mu.Unlock()
	return func() {
		u.mu.Lock()
		if e.n--; e.n == 0 {
			close(e.done)
			delete(u.m, k)
		}
		u.mu.Unlock()
	}
}

// await waits until no undoLate of req's name, kind and owner is in
// flight, or ctx ends.
func (u *lateUndos) await(ctx context.Context, req driver.AcquireRequest) error {
	u.mu.Lock()
	e := u.m[keyOf(req)]
	u.mu.Unlock()
	if e == nil {
		return nil
	}
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stragglers tracks, by name and kind, the nodes where a refused attempt's
// request is still on its way (undoLate). Such a request may yet be
// granted there, after the holder has released, and then keeps the lock
// from every attempt on that node until undoLate has released it. An
// attempt refused by such nodes, that a majority would have granted
// without them, waits until enough of them are done and tries again
// (attempt): before, a TryLock made right after the holder's Unlock
// returned could be refused by this driver's own earlier attempts
// (locktest's Reentrancy on a loaded machine: a new client's request to
// SQLite answered after its refusal and was granted once the holder had
// released there, while the holder's release to PostgreSQL was still on
// its way, Unlock having returned on a majority). Only refusing nodes
// count: a straggler on a hung node, which answers nothing, makes no
// attempt wait for it.
type stragglers struct {
	names atomic.Int32 // len(m), read without mu
	mu    sync.Mutex
	m     map[nameKind]*straggling
}

type nameKind struct {
	name string
	kind driver.Kind
}

// straggling is one name's nodes with requests in flight.
type straggling struct {
	busy    map[int]int   // node index → requests in flight there
	changed chan struct{} // closed, and replaced, when a node's last one ends
}

// begin records a request in flight for k on each of nodes, and returns
// the function that ends the one on node i.
func (s *stragglers) begin(k nameKind, nodes []int) func(i int) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[nameKind]*straggling{}
	}
	e := s.m[k]
	if e == nil {
		e = &straggling{busy: map[int]int{}, changed: make(chan struct{})}
		s.m[k] = e
		s.names.Add(1)
	}
	for _, i := range nodes {
		e.busy[i]++
	}
	s.mu.Unlock()
	return func(i int) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if e.busy[i]--; e.busy[i] > 0 {
			return
		}
		delete(e.busy, i)
		close(e.changed)
		e.changed = make(chan struct{})
		if len(e.busy) == 0 {
			delete(s.m, k)
			s.names.Add(-1)
		}
	}
}

// nodes returns the nodes with requests for k in flight.
func (s *stragglers) nodes(k nameKind) []int {
	if s.names.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil {
		return nil
	}
	out := make([]int, 0, len(e.busy))
	for i := range e.busy {
		out = append(out, i)
	}
	return out
}

// refusing returns the nodes that refused an attempt (ans) and had requests
// for k in flight when it was sent (before) or have them now.
func (s *stragglers) refusing(k nameKind, ans []answer, before []int) []int {
	var out []int
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	for i, a := range ans {
		if a.refused() && (slices.Contains(before, i) || (e != nil && e.busy[i] > 0)) {
			out = append(out, i)
		}
	}
	return out
}

// await waits until at least need of nodes have no request for k in
// flight, or ctx ends.
func (s *stragglers) await(ctx context.Context, k nameKind, nodes []int, need int) error {
	for {
		s.mu.Lock()
		e := s.m[k]
		if e == nil {
			s.mu.Unlock()
			return nil
		}
		free := 0
		for _, i := range nodes {
			if e.busy[i] == 0 {
				free++
			}
		}
		ch := e.changed
		s.mu.Unlock()
		if free >= need {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
