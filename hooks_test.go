package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memlock"
)

// event is one call a hookRecorder saw.
type event struct {
	what  string // "start", "attempt", "end", "lease", "renewal", "leaseEnd"
	op    dlock.OpInfo
	a     dlock.AttemptInfo
	r     dlock.OpResult
	l     dlock.LeaseInfo
	renew dlock.RenewalInfo
	e     dlock.LeaseEndInfo
	ctxOK bool // the context carried the recorder's key (Attempt, OpEnd)
}

type hookKey struct{}

// hookRecorder is a Hooks that records every call.
type hookRecorder struct {
	mu     sync.Mutex
	events []event
}

func (h *hookRecorder) add(e event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

func (h *hookRecorder) OpStart(ctx context.Context, op dlock.OpInfo) context.Context {
	h.add(event{what: "start", op: op})
	return context.WithValue(ctx, hookKey{}, op.Op)
}

func (h *hookRecorder) Attempt(ctx context.Context, op dlock.OpInfo, a dlock.AttemptInfo) {
	h.add(event{what: "attempt", op: op, a: a, ctxOK: ctx.Value(hookKey{}) == op.Op})
}

func (h *hookRecorder) OpEnd(ctx context.Context, op dlock.OpInfo, r dlock.OpResult) {
	h.add(event{what: "end", op: op, r: r, ctxOK: ctx.Value(hookKey{}) == op.Op})
}

func (h *hookRecorder) LeaseStart(l dlock.LeaseInfo) { h.add(event{what: "lease", l: l}) }

func (h *hookRecorder) Renewal(l dlock.LeaseInfo, r dlock.RenewalInfo) {
	h.add(event{what: "renewal", l: l, renew: r})
}

func (h *hookRecorder) LeaseEnd(l dlock.LeaseInfo, e dlock.LeaseEndInfo) {
	h.add(event{what: "leaseEnd", l: l, e: e})
}

// take returns the events recorded so far and forgets them.
func (h *hookRecorder) take() []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	ev := h.events
	h.events = nil
	return ev
}

// of returns the events recorded so far whose what is w.
func (h *hookRecorder) of(w string) []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []event
	for _, e := range h.events {
		if e.what == w {
			out = append(out, e)
		}
	}
	return out
}

// kinds lists what each event is, for messages.
func kinds(ev []event) []string {
	out := make([]string, len(ev))
	for i, e := range ev {
		out[i] = e.what
		if e.op.Op != "" {
			out[i] += ":" + e.op.Op
		}
	}
	return out
}

func wantWhats(t *testing.T, ev []event, want ...string) {
	t.Helper()
	if got := kinds(ev); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

func TestHooksLockExtendUnlock(t *testing.T) {
	h := &hookRecorder{}
	c, _ := newMem(t, &dlock.Options{Hooks: h})
	if c.Backend() != "mem" {
		t.Fatalf("Backend() = %q, want mem", c.Backend())
	}
	ctx := context.Background()
	l, err := c.NewMutex("orders/1", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev := h.take()
	wantWhats(t, ev, "start:lock", "attempt:lock", "lease", "end:lock")
	start, att, lease, end := ev[0], ev[1], ev[2], ev[3]
	if start.op.Backend != "mem" || start.op.Name != "orders/1" || start.op.Kind != "mutex" || start.op.Token != 0 || start.op.Start.IsZero() {
		t.Fatalf("OpStart %+v", start.op)
	}
	if !start.op.IsAcquire() || !start.op.Waits() {
		t.Fatalf("lock: IsAcquire %v, Waits %v", start.op.IsAcquire(), start.op.Waits())
	}
	if att.a.N != 1 || att.a.Outcome != dlock.OutcomeOK || att.a.Err != nil || !att.ctxOK {
		t.Fatalf("Attempt %+v (ctx from OpStart: %v)", att.a, att.ctxOK)
	}
	if lease.l != (dlock.LeaseInfo{Backend: "mem", Name: "orders/1", Kind: "mutex", Token: l.Token(), TTL: dlock.DefaultTTL}) {
		t.Fatalf("LeaseStart %+v, lease token %d", lease.l, l.Token())
	}
	if r := end.r; r.Outcome != dlock.OutcomeOK || r.Token != l.Token() || r.Attempts != 1 || r.Contended || r.Err != nil || !end.ctxOK {
		t.Fatalf("OpEnd %+v", r)
	}
	// The lease keeps the caller's context, not the hooks' one.
	if l.Context().Value(hookKey{}) != nil {
		t.Fatal("the lease's context carries the hooks' context values")
	}

	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	ev = h.take()
	wantWhats(t, ev, "start:extend", "end:extend")
	if ev[0].op.Token != l.Token() || ev[1].r.Outcome != dlock.OutcomeOK || ev[1].r.Token != l.Token() {
		t.Fatalf("Extend events %+v", ev)
	}

	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	ev = h.take()
	wantWhats(t, ev, "start:unlock", "leaseEnd", "end:unlock")
	if e := ev[1]; e.e.Outcome != dlock.OutcomeReleased || e.e.Cause != "" || e.e.Held <= 0 || !errors.Is(e.e.Err, dlock.ErrReleased) || e.l.TTL != time.Minute {
		t.Fatalf("LeaseEnd %+v %+v", e.l, e.e)
	}
	if r := ev[2].r; r.Outcome != dlock.OutcomeOK {
		t.Fatalf("Unlock's OpEnd %+v", r)
	}

	// Unlock of an ended lease: the operation is reported, the lease's end
	// is not reported twice.
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Unlock: %v", err)
	}
	ev = h.take()
	wantWhats(t, ev, "start:unlock", "end:unlock")
	if ev[1].r.Outcome != dlock.OutcomeNotHeld {
		t.Fatalf("second Unlock's outcome %q", ev[1].r.Outcome)
	}
}

func TestHooksContention(t *testing.T) {
	h := &hookRecorder{}
	c, _ := newMem(t, &dlock.Options{Hooks: h, WaitMax: 20 * time.Millisecond})
	ctx := context.Background()
	m := c.NewMutex("busy", nil)
	held, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.take()

	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock of a held lock: %v", err)
	}
	ev := h.take()
	wantWhats(t, ev, "start:trylock", "attempt:trylock", "end:trylock")
	if ev[0].op.Waits() {
		t.Fatal("trylock Waits")
	}
	if a := ev[1].a; a.Outcome != dlock.OutcomeLocked || a.HolderToken != held.Token() || a.RetryAfter <= 0 || !errors.Is(a.Err, dlock.ErrLocked) {
		t.Fatalf("refused attempt %+v, holder token %d", a, held.Token())
	}
	if r := ev[2].r; r.Outcome != dlock.OutcomeLocked || !r.Contended || r.Attempts != 1 || r.Token != 0 {
		t.Fatalf("refused TryLock's OpEnd %+v", r)
	}

	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Errorf("waiting Lock: %v", err)
		}
		got <- l
	}()
	eventually(t, 10*time.Second, "the waiting Lock to be refused", func() bool { return len(h.of("attempt")) > 0 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var l *dlock.Lease
	select {
	case l = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting Lock was not granted")
	}
	if l == nil {
		return
	}
	defer l.Unlock(ctx)
	var end event
	attempts := 0
	for _, e := range h.take() {
		switch {
		case e.what == "attempt" && e.op.Op == "lock":
			attempts++
		case e.what == "end" && e.op.Op == "lock":
			end = e
		}
	}
	if r := end.r; r.Outcome != dlock.OutcomeOK || !r.Contended || r.Attempts < 2 || r.Attempts != attempts || r.Token != l.Token() || r.Duration <= 0 {
		t.Fatalf("waited Lock's OpEnd %+v (%d attempts seen)", r, attempts)
	}
}

// recordedLog is one slog record a logCapture kept.
type recordedLog struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

// logCapture is a slog handler that keeps every record.
type logCapture struct {
	mu   sync.Mutex
	recs []recordedLog
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	rec := recordedLog{level: r.Level, msg: r.Message, attrs: map[string]slog.Value{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value
		return true
	})
	c.mu.Lock()
	c.recs = append(c.recs, rec)
	c.mu.Unlock()
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

func (c *logCapture) records() []recordedLog {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

// checkLeaseAttrs fails t unless rec names the lease: backend, name, token.
func checkLeaseAttrs(t *testing.T, rec recordedLog, l *dlock.Lease) {
	t.Helper()
	tok := rec.attrs["token"]
	if rec.attrs["backend"].String() != "mem" || rec.attrs["name"].String() != l.Name() || tok.Kind() != slog.KindUint64 || tok.Uint64() != l.Token() {
		t.Fatalf("record %q %v does not name backend mem, name %q, token %d", rec.msg, rec.attrs, l.Name(), l.Token())
	}
}

// Renewals that fail are reported (hooks) and logged at Warn, with the
// attempt and the time left, before the lease is lost at its deadline,
// which is reported (LeaseEnd, cause deadline) and logged at Error.
func TestHooksRenewalFailuresBeforeLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &hookRecorder{}
		logs := &logCapture{}
		c, d := newMem(t, &dlock.Options{TTL: 3 * time.Second, Hooks: h, Logger: slog.New(logs)})
		l, err := c.NewMutex("renew", nil).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// One renewal gets through first.
		time.Sleep(1500 * time.Millisecond) // the fake clock of the bubble
		if rs := h.of("renewal"); len(rs) != 1 || rs[0].renew.Outcome != dlock.OutcomeOK || rs[0].renew.Failures != 0 ||
			rs[0].renew.ValidFor < 2*time.Second || rs[0].renew.Batch != 1 || rs[0].l.Token != l.Token() {
			t.Fatalf("renewals after 1.5s: %+v", rs)
		}
		cut := errors.New("connection cut")
		d.FailCalls(func(op string) error {
			if op == "renew" {
				return cut
			}
			return nil
		})
		<-l.Done()
		var fails []dlock.RenewalInfo
		for _, e := range h.of("renewal")[1:] {
			fails = append(fails, e.renew)
		}
		if len(fails) < 2 {
			t.Fatalf("%d failed renewals reported before the loss, want several", len(fails))
		}
		for i, r := range fails {
			if r.Outcome != dlock.OutcomeError || !errors.Is(r.Err, cut) || r.Failures != i+1 || r.ValidFor <= 0 {
				t.Fatalf("failed renewal %d: %+v", i, r)
			}
			if i > 0 && r.ValidFor >= fails[i-1].ValidFor {
				t.Fatalf("time left does not shrink: %v then %v", fails[i-1].ValidFor, r.ValidFor)
			}
		}
		ends := h.of("leaseEnd")
		if len(ends) != 1 || ends[0].e.Outcome != dlock.OutcomeLost || ends[0].e.Cause != dlock.CauseDeadline ||
			!errors.Is(ends[0].e.Err, dlock.ErrLeaseLost) || ends[0].e.Held < 2*time.Second {
			t.Fatalf("LeaseEnd %+v", ends)
		}

		recs := logs.records()
		firstWarn, lostAt := -1, -1
		for i, r := range recs {
			switch {
			case r.level == slog.LevelWarn && strings.Contains(r.msg, "renewal failed"):
				checkLeaseAttrs(t, r, l)
				if firstWarn < 0 {
					firstWarn = i
					if a, v := r.attrs["attempt"], r.attrs["valid_for"]; a.Kind() != slog.KindInt64 || a.Int64() != 1 ||
						v.Kind() != slog.KindDuration || v.Duration() <= 0 || r.attrs["err"].String() != cut.Error() {
						t.Fatalf("first renewal warning %v", r.attrs)
					}
				}
			case strings.Contains(r.msg, "lease lost"):
				if r.level != slog.LevelError {
					t.Fatalf("loss logged at %v, want ERROR", r.level)
				}
				checkLeaseAttrs(t, r, l)
				if !strings.Contains(r.attrs["cause"].String(), "validity deadline") {
					t.Fatalf("loss record's cause %v", r.attrs["cause"])
				}
				lostAt = i
			}
		}
		if firstWarn < 0 || lostAt < 0 || firstWarn > lostAt {
			t.Fatalf("want a renewal warning before the loss record; records: %+v", recs)
		}
	})
}

// A renewal that hangs (a paused server) fails only at the lease's deadline;
// it is logged at Warn once it has gone unanswered for a renewal interval,
// before the loss.
func TestRenewalUnansweredWarnsBeforeLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logCapture{}
		c, d := newMem(t, &dlock.Options{TTL: 30 * time.Second, Logger: slog.New(logs)})
		l, err := c.NewMutex("paused", nil).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		d.Pause()
		defer d.Resume()
		start := time.Now()
		<-l.Done()
		lostAfter := time.Since(start)
		var warnAt time.Duration = -1
		for _, r := range logs.records() {
			if strings.Contains(r.msg, "not answered") {
				if r.level != slog.LevelWarn {
					t.Fatalf("unanswered renewal logged at %v", r.level)
				}
				checkLeaseAttrs(t, r, l)
				w, v := r.attrs["waited"], r.attrs["valid_for"]
				if w.Kind() != slog.KindDuration || v.Kind() != slog.KindDuration {
					t.Fatalf("unanswered renewal record %v", r.attrs)
				}
				warnAt = w.Duration() + 10*time.Second // renewals start at TTL/3
				if left := v.Duration(); left < 5*time.Second {
					t.Fatalf("warned with only %v left", left)
				}
			}
		}
		if warnAt < 0 || warnAt >= lostAfter {
			t.Fatalf("no warning before the loss at %v (warned at %v): %+v", lostAfter, warnAt, logs.records())
		}
	})
}

// A renewal that finds the grant gone reports it and the loss (cause
// not_held); Close ends the others as closed.
func TestHooksLossAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &hookRecorder{}
		d := memlock.NewBackend().NewDriver()
		c := dlock.New(d, &dlock.Options{TTL: 3 * time.Second, Hooks: h})
		defer c.Close()
		ctx := context.Background()
		dropped, err := c.NewMutex("dropped", nil).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kept, err := c.NewSemaphore("kept", 2, nil).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d.Backend().Drop("dropped")
		<-dropped.Done()
		var last dlock.RenewalInfo
		for _, e := range h.of("renewal") {
			if e.l.Name == "dropped" {
				last = e.renew
			}
		}
		if last.Outcome != dlock.OutcomeLost || !errors.Is(last.Err, dlock.ErrNotHeld) || last.Failures != 1 || last.Batch != 2 {
			t.Fatalf("the dropped lease's last renewal %+v", last)
		}
		ends := h.of("leaseEnd")
		if len(ends) != 1 || ends[0].l.Name != "dropped" || ends[0].e.Outcome != dlock.OutcomeLost || ends[0].e.Cause != dlock.CauseNotHeld {
			t.Fatalf("LeaseEnd after a drop: %+v", ends)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		ends = h.of("leaseEnd")
		if len(ends) != 2 || ends[1].l != (dlock.LeaseInfo{Backend: "mem", Name: "kept", Kind: "permit", Token: kept.Token(), TTL: 3 * time.Second}) ||
			ends[1].e.Outcome != dlock.OutcomeClosed || !errors.Is(ends[1].e.Err, dlock.ErrClosed) {
			t.Fatalf("LeaseEnd after Close: %+v", ends)
		}
	})
}

func TestHooksLockTypes(t *testing.T) {
	h := &hookRecorder{}
	c, _ := newMem(t, &dlock.Options{Hooks: h})
	ctx := context.Background()

	rw := c.NewRWMutex("cfg", nil)
	r, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock beside a reader: %v", err)
	}
	_ = r.Unlock(ctx)
	ev := h.take()
	wantWhats(t, ev, "start:rlock", "attempt:rlock", "lease", "end:rlock", "start:trylock", "attempt:trylock", "end:trylock",
		"start:unlock", "leaseEnd", "end:unlock")
	if ev[0].op.Kind != "read" || ev[2].l.Kind != "read" || ev[4].op.Kind != "write" || !ev[6].r.Contended || ev[7].op.Kind != "read" {
		t.Fatalf("kinds: %+v %+v %+v", ev[0].op, ev[2].l, ev[4].op)
	}

	p, err := c.NewSemaphore("enc", 3, nil).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Unlock(ctx)
	ev = h.take()
	wantWhats(t, ev, "start:tryacquire", "attempt:tryacquire", "lease", "end:tryacquire", "start:unlock", "leaseEnd", "end:unlock")
	if ev[0].op.Kind != "permit" || ev[3].r.Token != p.Token() {
		t.Fatalf("semaphore events %+v %+v", ev[0].op, ev[3].r)
	}

	// memlock takes a MultiMutex in one atomic call: one attempt, a grant
	// per name.
	ml, err := c.NewMultiMutex([]string{"b", "a"}, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev = h.take()
	wantWhats(t, ev, "start:trylock", "attempt:trylock", "lease", "lease", "end:trylock")
	if op := ev[0].op; op.Kind != "multi" || op.Name != "a,b" || !slices.Equal(op.Names, []string{"a", "b"}) {
		t.Fatalf("multi OpStart %+v", op)
	}
	if ev[2].l.Name != "a" || ev[3].l.Name != "b" || ev[4].r.Token != ml.Token() {
		t.Fatalf("multi grants %+v %+v, end %+v", ev[2].l, ev[3].l, ev[4].r)
	}
	_ = ml.Unlock(ctx)
	if ends := h.of("leaseEnd"); len(ends) != 2 {
		t.Fatalf("%d LeaseEnd after a MultiLease's Unlock, want 2", len(ends))
	}
}

// Operations that fail before reaching the backend are reported too.
func TestHooksInvalid(t *testing.T) {
	h := &hookRecorder{}
	c, _ := newMem(t, &dlock.Options{Hooks: h})
	if _, err := c.NewMutex("", nil).TryLock(context.Background()); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("TryLock(\"\"): %v", err)
	}
	var nilCtx context.Context
	if _, err := c.NewMutex("x", nil).Lock(nilCtx); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Lock(nil): %v", err)
	}
	ev := h.take()
	wantWhats(t, ev, "start:trylock", "end:trylock", "start:lock", "end:lock")
	if ev[1].r.Outcome != dlock.OutcomeInvalid || ev[3].r.Outcome != dlock.OutcomeInvalid || ev[1].r.Attempts != 0 {
		t.Fatalf("outcomes %+v %+v", ev[1].r, ev[3].r)
	}
}

// orderHooks records the order in which joined hooks are called.
type orderHooks struct {
	dlock.NopHooks
	name string
	log  *[]string
}

type orderKey string

func (o orderHooks) OpStart(ctx context.Context, _ dlock.OpInfo) context.Context {
	*o.log = append(*o.log, "start "+o.name)
	return context.WithValue(ctx, orderKey(o.name), true)
}

func (o orderHooks) OpEnd(ctx context.Context, _ dlock.OpInfo, _ dlock.OpResult) {
	*o.log = append(*o.log, fmt.Sprintf("end %s a=%v b=%v", o.name, ctx.Value(orderKey("a")) != nil, ctx.Value(orderKey("b")) != nil))
}

func (o orderHooks) LeaseStart(dlock.LeaseInfo) { *o.log = append(*o.log, "lease "+o.name) }

func TestJoinHooks(t *testing.T) {
	if dlock.JoinHooks() != nil || dlock.JoinHooks(nil, nil) != nil {
		t.Fatal("JoinHooks of nothing is not nil")
	}
	var log []string
	a := orderHooks{name: "a", log: &log}
	if got := dlock.JoinHooks(nil, a); got != dlock.Hooks(a) {
		t.Fatalf("JoinHooks of one = %#v", got)
	}
	b := orderHooks{name: "b", log: &log}
	c, _ := newMem(t, &dlock.Options{Hooks: dlock.JoinHooks(a, nil, dlock.JoinHooks(b))})
	l, err := c.NewMutex("j", nil).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	want := []string{"start a", "start b", "lease a", "lease b", "end b a=true b=true", "end a a=true b=true"}
	if !slices.Equal(log, want) {
		t.Fatalf("calls %q, want %q", log, want)
	}
}

func TestOpenWith(t *testing.T) {
	h := &hookRecorder{}
	c, err := dlock.OpenWith(context.Background(), "mem://openwith?ttl=7s", &dlock.Options{TTL: time.Minute, Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Backend() != "mem" {
		t.Fatalf("Backend() = %q", c.Backend())
	}
	l, err := c.NewMutex("x", nil).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	leases := h.of("lease")
	if len(leases) != 1 || leases[0].l.TTL != 7*time.Second {
		t.Fatalf("LeaseStart %+v: want the hooks called and the URL's ttl to win", leases)
	}
	if _, err := dlock.OpenWith(context.Background(), "mem://x?ttl=soon", &dlock.Options{Hooks: h}); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("OpenWith of a bad ttl: %v", err)
	}
}

func TestOutcomeOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want dlock.Outcome
	}{
		{nil, dlock.OutcomeOK},
		{fmt.Errorf("x: %w", dlock.ErrLocked), dlock.OutcomeLocked},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), dlock.OutcomeCanceled},
		{fmt.Errorf("%w (after retrying: %w)", context.Canceled, errors.New("down")), dlock.OutcomeCanceled},
		{dlock.ErrClosed, dlock.OutcomeClosed},
		{fmt.Errorf("x: %w", dlock.ErrUnsupported), dlock.OutcomeInvalid},
		{dlock.ErrNotHeld, dlock.OutcomeNotHeld},
		{fmt.Errorf("lost: %w", dlock.ErrLeaseLost), dlock.OutcomeLost},
		{errors.New("connection refused"), dlock.OutcomeError},
	} {
		if got := dlock.OutcomeOf(c.err); got != c.want {
			t.Errorf("OutcomeOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// BenchmarkLockUnlockHooks measures a Lock+Unlock on memlock without Hooks
// (none: no allocation for Hooks, 4 allocs/op, 328 B/op) and with Hooks that
// do nothing (nop: the cost of building the events, 4 allocs/op more).
func BenchmarkLockUnlockHooks(b *testing.B) {
	for _, bc := range []struct {
		name  string
		hooks dlock.Hooks
	}{{"none", nil}, {"nop", dlock.NopHooks{}}} {
		b.Run(bc.name, func(b *testing.B) {
			c := dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{Hooks: bc.hooks})
			defer c.Close()
			m := c.NewMutex("bench", nil)
			b.ReportAllocs()
			for b.Loop() {
				lockUnlock(b, m)
			}
		})
	}
}
