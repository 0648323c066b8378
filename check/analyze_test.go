package check

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// hb builds synthetic histories; times are milliseconds from the run's start.
type hb struct{ h *History }

const t0 = int64(1_000_000_000_000) // an arbitrary CLOCK_MONOTONIC origin

func ms(x int) int64 { return t0 + int64(x)*int64(time.Millisecond) }

func newHB(backend string, ttl time.Duration) *hb {
	return &hb{h: &History{Backend: backend, URL: backend + "://127.0.0.1:1", TTL: ttl,
		Workers: 3, Goroutines: 1, Locks: []string{"a"}, Start: t0, End: t0}}
}

func (b *hb) ev(e Event) *hb {
	e.Wall = time.Unix(0, e.Mono)
	if e.Mono > b.h.End {
		b.h.End = e.Mono
	}
	b.h.Events = append(b.h.Events, e)
	return b
}

func (b *hb) req(w int, op int64, at int) *hb {
	return b.ev(Event{Kind: KindRequest, Mono: ms(at), Worker: w, Lock: "a", Op: op})
}

func (b *hb) grant(w int, op int64, at int, token uint64, validUntil int) *hb {
	return b.ev(Event{Kind: KindGrant, Mono: ms(at), Worker: w, Lock: "a", Op: op, Token: token, ValidUntil: ms(validUntil)})
}

func (b *hb) valid(w int, op int64, at, validUntil int) *hb {
	return b.ev(Event{Kind: KindValid, Mono: ms(at), Worker: w, Lock: "a", Op: op, ValidUntil: ms(validUntil)})
}

func (b *hb) write(w int, op int64, at int, token uint64, validUntil int, accepted bool) *hb {
	return b.ev(Event{Kind: KindWrite, Mono: ms(at), Worker: w, Lock: "a", Op: op, Token: token, ValidUntil: ms(validUntil), Accepted: accepted})
}

func (b *hb) done(w int, op int64, at int, err string) *hb {
	return b.ev(Event{Kind: KindDone, Mono: ms(at), Worker: w, Lock: "a", Op: op, Err: err})
}

func (b *hb) unlock(w int, op int64, start, end int, err string) *hb {
	b.ev(Event{Kind: KindUnlockStart, Mono: ms(start), Worker: w, Lock: "a", Op: op})
	return b.ev(Event{Kind: KindUnlockEnd, Mono: ms(end), Worker: w, Lock: "a", Op: op, Err: err})
}

func (b *hb) fault(name, target string, start, end int) *hb {
	if !slices.Contains(b.h.Faults, name) {
		b.h.Faults = append(b.h.Faults, name)
	}
	b.ev(Event{Kind: KindFaultStart, Mono: ms(start), Worker: -1, Fault: name, Target: target})
	return b.ev(Event{Kind: KindFaultEnd, Mono: ms(end), Worker: -1, Fault: name, Target: target})
}

// hold is a whole clean critical section: request, grant, one write, release.
func (b *hb) hold(w int, op int64, req, grant, release int, token uint64, ttl int) *hb {
	b.req(w, op, req).grant(w, op, grant, token, grant+ttl)
	b.write(w, op, grant+1, token, grant+ttl, true)
	return b.unlock(w, op, release, release+1, "")
}

// run sorts the events (as a History is) and analyses it.
func (b *hb) run(t *testing.T) *Report {
	t.Helper()
	slices.SortStableFunc(b.h.Events, func(x, y Event) int { return int(x.Mono - y.Mono) })
	r := Analyze(b.h)
	if testing.Verbose() {
		var buf bytes.Buffer
		if err := r.WriteText(&buf); err != nil {
			t.Fatal(err)
		}
		t.Log("\n" + buf.String())
	}
	return r
}

func count(r *Report, class string) (n, admitted int) {
	for _, v := range r.Violations {
		if v.Class == class {
			n++
			if v.Admitted {
				admitted++
			}
		}
	}
	return n, admitted
}

// want checks the count of every class: those named in w, zero for the rest.
func want(t *testing.T, r *Report, w map[string]int) {
	t.Helper()
	for _, c := range AllClasses {
		if n, _ := count(r, c); n != w[c] {
			t.Errorf("%s: %d violations, want %d", c, n, w[c])
			for _, v := range r.Violations {
				if v.Class == c {
					t.Logf("  %s", v.Evidence)
				}
			}
		}
	}
}

// A clean run: hand-overs at release (one exactly at the instant Unlock
// starts), a holder SIGSTOPped past its lease that lost, wrote late and was
// refused by the fence, recording lag on Done, and a replacement worker
// that reuses the killed worker's index and op numbers.
func TestAnalyzeClean(t *testing.T) {
	b := newHB("redis", time.Second)
	// w0 takes token 1, reads its validity, is paused 250ms..2500ms.
	b.req(0, 1, 0).grant(0, 1, 0, 1, 1000).valid(0, 1, 200, 1000)
	b.fault(FaultPauseHolder, "worker 0", 250, 2500)
	// w1 waits from 100ms, gets the lock after w0's lease ran out.
	b.req(1, 1, 100).grant(1, 1, 1100, 2, 2100).write(1, 1, 1200, 2, 2100, true)
	// w2 waits from 150ms and is granted at the very instant w1 starts Unlock.
	b.req(2, 1, 150)
	b.unlock(1, 1, 1300, 1302, "")
	b.grant(2, 1, 1300, 3, 2300).write(2, 1, 1310, 3, 2300, true).unlock(2, 1, 1400, 1401, "")
	// w0 resumes: its late write is refused, Done closes, Unlock fails.
	b.write(0, 1, 2500, 1, 1000, false).done(0, 1, 2501, "lease lost").unlock(0, 1, 2502, 2503, "not held")
	// Done recorded late: w1's next lease ends at 3500 by its deadline,
	// Done is recorded at 3550 and w2 was granted at 3520.
	b.req(1, 2, 2600).grant(1, 2, 2600, 4, 3500).valid(1, 2, 3000, 3500)
	b.req(2, 2, 2700).grant(2, 2, 3520, 5, 4500).done(1, 2, 3550, "lease lost")
	b.unlock(2, 2, 3600, 3601, "")
	// w0 is killed holding token 6; its replacement reuses w0/op 1.
	b.req(0, 1, 3700).grant(0, 1, 3700, 6, 4700)
	b.fault(FaultKillHolder, "worker 0", 3800, 3810)
	b.req(0, 1, 3900).grant(0, 1, 4800, 7, 5800).hold(1, 3, 5000, 5100, 5200, 8, 1000)
	b.unlock(0, 1, 4900, 4901, "")
	r := b.run(t)
	want(t, r, nil)
	if r.Failed() {
		t.Errorf("Failed() on a clean history")
	}
	if r.Grants != 8 || r.FenceRejected != 1 || r.Faults != 2 {
		t.Errorf("grants %d fence-rejected %d faults %d; want 8, 1, 2", r.Grants, r.FenceRejected, r.Faults)
	}
	// w0's section (0..2500) overlaps w1's and w2's.
	if r.UnfencedOverlaps != 2 {
		t.Errorf("unfenced overlaps %d, want 2", r.UnfencedOverlaps)
	}
}

func TestAnalyzeValidityOverlap(t *testing.T) {
	b := newHB("redis", time.Second)
	b.req(0, 1, 0).grant(0, 1, 0, 1, 1000)
	b.req(1, 1, 100).grant(1, 1, 500, 2, 1500)
	b.unlock(0, 1, 600, 601, "not held").unlock(1, 1, 700, 701, "")
	r := b.run(t)
	want(t, r, map[string]int{ClassValidityOverlap: 1})
	if !r.Failed() {
		t.Error("not Failed")
	}
	v := r.Violations[0]
	if len(v.Ops) != 2 || v.Ops[0].Token != 1 || v.Ops[1].Token != 2 || v.At != ms(500) {
		t.Errorf("violation %+v", v)
	}
	if !strings.Contains(v.Evidence, "token 1") || !strings.Contains(v.Evidence, "token 2") {
		t.Errorf("evidence %q lacks the tokens", v.Evidence)
	}
}

// A worker killed by kill-holder dies between the fault's start (marked
// before the signal) and its end (marked once the process exited). A lease
// it was granted in between ends at its own grant: counting the death from
// the start alone left it its whole TTL (57 validity-overlap violations in
// one postgres/advisory kill-holder cell). A lease granted before the start
// ends at the start: the server frees a session-bound lock as the process
// dies, before the end is marked (counting the death from the end alone
// made a violation of a mysql/getlock grant 1ms before it). A kill without
// an end counts from its start.
func TestAnalyzeKillAfterMark(t *testing.T) {
	b := newHB("postgres", time.Second)
	b.req(0, 1, 0).grant(0, 1, 101, 1, 1101)
	b.fault(FaultKillHolder, "worker 0", 100, 105)
	b.hold(1, 1, 50, 110, 200, 2, 1000)
	want(t, b.run(t), nil)

	b = newHB("mysql", time.Second)
	b.req(0, 1, 0).grant(0, 1, 50, 1, 1050)
	b.fault(FaultKillHolder, "worker 0", 100, 135)
	b.hold(1, 1, 50, 131, 200, 2, 1000)
	want(t, b.run(t), nil)

	b = newHB("postgres", time.Second)
	b.req(0, 1, 0).grant(0, 1, 0, 1, 1000)
	b.ev(Event{Kind: KindFaultStart, Mono: ms(100), Worker: -1, Fault: FaultKillHolder, Target: "worker 0"})
	b.hold(1, 1, 50, 110, 200, 2, 1000)
	want(t, b.run(t), nil)
}

// A holder whose renewal moved its deadline believes the later one.
func TestAnalyzeValidityOverlapAfterRenewal(t *testing.T) {
	b := newHB("etcd", time.Second)
	b.req(0, 1, 0).grant(0, 1, 0, 1, 1000).valid(0, 1, 900, 1900)
	b.req(1, 1, 100).grant(1, 1, 1500, 2, 2500)
	r := b.run(t)
	want(t, r, map[string]int{ClassValidityOverlap: 1})
}

func TestAnalyzeUnsafeWrite(t *testing.T) {
	b := newHB("redis", time.Second)
	b.req(0, 1, 0).grant(0, 1, 0, 1, 1000)
	b.req(1, 1, 100).grant(1, 1, 500, 2, 1500).write(1, 1, 550, 2, 1500, true)
	b.write(0, 1, 600, 1, 1000, false)
	// a write after the writer's own Done is the workload's fault, not dlock's
	b.done(0, 1, 650, "lost").write(0, 1, 700, 1, 1000, false)
	r := b.run(t)
	want(t, r, map[string]int{ClassValidityOverlap: 1, ClassUnsafeWrite: 1})
	for _, v := range r.Violations {
		if v.Class == ClassUnsafeWrite && !strings.Contains(v.Evidence, "rejected") {
			t.Errorf("evidence %q does not say the fence rejected it", v.Evidence)
		}
	}
}

func TestAnalyzeTokenOrder(t *testing.T) {
	b := newHB("sqlite", time.Second)
	b.hold(0, 1, 0, 0, 100, 5, 1000)
	b.hold(1, 1, 200, 210, 300, 4, 1000) // requested after token 5 was granted
	b.hold(2, 1, 400, 410, 500, 5, 1000) // again, and a duplicate of token 5
	r := b.run(t)
	want(t, r, map[string]int{ClassTokenOrder: 2, ClassDuplicateToken: 1})
}

// Grants whose requests were concurrent may be granted in any token order;
// only duplicates are wrong then.
func TestAnalyzeDuplicateTokenConcurrent(t *testing.T) {
	b := newHB("sqlite", time.Second)
	b.req(1, 1, 0).req(2, 1, 0)
	b.grant(1, 1, 10, 7, 1010).unlock(1, 1, 100, 101, "")
	b.grant(2, 1, 110, 7, 1110).unlock(2, 1, 200, 201, "")
	b.req(0, 1, 0).grant(0, 1, 210, 6, 1210).unlock(0, 1, 300, 301, "") // smaller, but requested before
	r := b.run(t)
	want(t, r, map[string]int{ClassDuplicateToken: 1})
}

func TestAnalyzeLateUnlock(t *testing.T) {
	b := newHB("redis", time.Second)
	b.req(0, 1, 0).grant(0, 1, 0, 1, 1000).done(0, 1, 1000, "lease lost")
	b.req(1, 1, 100).grant(1, 1, 1500, 2, 2500)
	b.unlock(0, 1, 1600, 1610, "") // nil although token 2 was granted
	b.unlock(1, 1, 1700, 1701, "")
	r := b.run(t)
	want(t, r, map[string]int{ClassLateUnlock: 1})
}

func TestAnalyzeLiveness(t *testing.T) {
	ttl := 100 * time.Millisecond // bound 200ms; recovery 1.1s
	t.Run("stall", func(t *testing.T) {
		b := newHB("postgres", ttl)
		b.hold(0, 1, 0, 0, 100, 1, 100)
		b.req(1, 1, 50).grant(1, 1, 1000, 2, 1100).unlock(1, 1, 1050, 1051, "")
		r := b.run(t)
		want(t, r, map[string]int{ClassLiveness: 1})
		if v := r.Violations[0]; v.From != ms(101) || v.At != ms(1000) {
			t.Errorf("stretch %s..%s, want 0.101s..1.000s", time.Duration(v.From-t0), time.Duration(v.At-t0))
		}
	})
	t.Run("within bound", func(t *testing.T) {
		b := newHB("postgres", ttl)
		b.hold(0, 1, 0, 0, 100, 1, 100)
		b.req(1, 1, 50).grant(1, 1, 300, 2, 400).unlock(1, 1, 350, 351, "")
		want(t, b.run(t), nil)
	})
	t.Run("fault window", func(t *testing.T) {
		b := newHB("postgres", ttl)
		b.hold(0, 1, 0, 0, 100, 1, 100)
		b.fault(FaultPauseServer, "server 0", 100, 150)
		b.req(1, 1, 50).grant(1, 1, 1200, 2, 1300).unlock(1, 1, 1250, 1251, "")
		want(t, b.run(t), nil)
	})
	t.Run("no recovery after the fault", func(t *testing.T) {
		b := newHB("postgres", ttl)
		b.hold(0, 1, 0, 0, 100, 1, 100)
		b.fault(FaultPauseServer, "server 0", 100, 150)
		b.req(1, 1, 50).grant(1, 1, 5000, 2, 5100).unlock(1, 1, 5050, 5051, "")
		r := b.run(t)
		want(t, r, map[string]int{ClassLiveness: 1})
		if v := r.Violations[0]; v.From != ms(1250) {
			t.Errorf("stretch starts at %s, want at the end of the fault's recovery, 1.25s", time.Duration(v.From-t0))
		}
	})
	t.Run("killed waiter", func(t *testing.T) {
		b := newHB("postgres", ttl)
		b.req(1, 1, 50) // never answered: its worker was killed
		b.ev(Event{Kind: KindPanic, Mono: ms(60), Worker: 1, Err: "exit status 2"})
		b.hold(0, 1, 5000, 5000, 5100, 1, 100)
		want(t, b.run(t), map[string]int{ClassPanic: 1})
	})
}

func TestAnalyzeLeakPanic(t *testing.T) {
	b := newHB("zk", time.Second)
	b.hold(0, 1, 0, 0, 100, 1, 1000)
	b.ev(Event{Kind: KindLeak, Mono: ms(200), Worker: 0, Err: "3 goroutines: zk.(*Conn).loop"})
	b.ev(Event{Kind: KindPanic, Mono: ms(210), Worker: 1, Err: "panic: boom\ngoroutine 1 [running]:"})
	r := b.run(t)
	want(t, r, map[string]int{ClassLeak: 1, ClassPanic: 1})
	for _, v := range r.Violations {
		if strings.Contains(v.Evidence, "goroutine 1") {
			t.Errorf("panic evidence keeps the stack: %q", v.Evidence)
		}
	}
}

// wiped builds Redis restarted without its data under a holder: the next
// owner gets the lock at once with token 1.
func wiped(backend string) *hb {
	b := newHB(backend, time.Second)
	b.req(0, 1, 0).grant(0, 1, 0, 7, 1000)
	b.fault(FaultRestartWiped, "server 0", 300, 400)
	b.req(1, 1, 450).grant(1, 1, 500, 1, 1500).unlock(1, 1, 600, 601, "")
	b.unlock(0, 1, 700, 701, "not held")
	return b
}

func TestAnalyzeAdmitted(t *testing.T) {
	r := wiped("redis").run(t)
	want(t, r, map[string]int{ClassValidityOverlap: 1, ClassTokenOrder: 1})
	if r.Failed() {
		t.Errorf("Failed() although Redis without persistence is admitted")
	}
	for _, c := range r.Classes {
		if c.Count > 0 && (!c.Admitted || !strings.Contains(c.Why, FaultRestartWiped)) {
			t.Errorf("class %+v not admitted by restart-wiped", c)
		}
	}
	if !strings.HasPrefix(r.Verdict(), "PASS") {
		t.Errorf("verdict %q", r.Verdict())
	}

	// etcd promises to survive a member's loss: nothing is admitted.
	if r := wiped("etcd").run(t); !r.Failed() {
		t.Errorf("etcd with restart-wiped violations: not Failed")
	}

	// A violation far from the fault's window is not admitted.
	b := wiped("redis")
	b.req(2, 1, 9000).grant(2, 1, 9000, 2, 10000)
	b.req(0, 2, 9000).grant(0, 2, 9500, 3, 10500)
	r = b.run(t)
	if !r.Failed() {
		t.Errorf("an overlap 9s after a wiped restart was admitted")
	}
	if n, adm := count(r, ClassValidityOverlap); n != 2 || adm != 1 {
		t.Errorf("validity-overlap %d (%d admitted), want 2 (1)", n, adm)
	}
}

func TestAdmission(t *testing.T) {
	for _, c := range []struct {
		backend, url, fault, class string
		ok                         bool
	}{
		{"redis", "", FaultRestartWiped, ClassDuplicateToken, true},
		{"redlock", "", FaultRestartWiped, ClassValidityOverlap, true},
		{"redis", "", FaultRestartWiped, ClassLateUnlock, false},
		{"redis", "", FaultRestartWiped, ClassLiveness, false},
		{"redis", "", FaultRestartServer, ClassValidityOverlap, false},
		{"redis", "", FaultPauseHolder, ClassValidityOverlap, false},
		{"redis", "", FaultClockJump, ClassValidityOverlap, true},
		{"redis", "", FaultClockJump, ClassTokenOrder, false},
		{"redlock", "", FaultClockJump, ClassTokenOrder, true},
		{"etcd", "", FaultRestartWiped, ClassValidityOverlap, false},
		{"etcd", "", FaultKillLeader, ClassValidityOverlap, false},
		{"zk", "", FaultClockJump, ClassValidityOverlap, false},
		{"zk", "", FaultPartition, ClassValidityOverlap, false},
		{"postgres", "postgres://u@h/db", FaultClockJump, ClassValidityOverlap, true},
		{"postgres", "postgres://u@h/db?mode=advisory", FaultClockJump, ClassValidityOverlap, false},
		{"postgres", "postgres://u@h/db?mode=advisory", FaultKillSession, ClassUnsafeWrite, true},
		{"postgres/rowlock", "", FaultRestartServer, ClassValidityOverlap, true},
		{"postgres/rowlock", "", FaultRestartServer, ClassTokenOrder, false},
		{"postgres", "", FaultKillSession, ClassValidityOverlap, false},
		{"mysql/getlock", "", FaultKillSession, ClassValidityOverlap, true},
		{"mysql/lease", "", FaultClockJump, ClassUnsafeWrite, true},
		{"sqlite", "", FaultClockJump, ClassValidityOverlap, true},
		{"mem", "", FaultRestartWiped, ClassValidityOverlap, false},
		{"", "::bad", FaultNone, ClassPanic, false},
	} {
		why, ok := Admission(c.backend, c.url, c.fault, c.class)
		if ok != c.ok || ok != (why != "") {
			t.Errorf("Admission(%q, %q, %s, %s) = %q, %v; want %v", c.backend, c.url, c.fault, c.class, why, ok, c.ok)
		}
	}
}

func TestReportText(t *testing.T) {
	b := newHB("redis", time.Second)
	for i := 0; i < 5; i++ { // five overlaps: the table shows three
		w := i % 3
		b.req(w, int64(i+1), i*100).grant(w, int64(i+1), i*100, uint64(i+1), i*100+1000)
	}
	r := b.run(t)
	var buf bytes.Buffer
	if err := r.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, s := range []string{"grants", "fence rejected", "unfenced overlaps", "validity-overlap", "VIOLATION", "… and", "FAIL"} {
		if !strings.Contains(out, s) {
			t.Errorf("text report lacks %q:\n%s", s, out)
		}
	}
	if n := strings.Count(out, "  - "); n != 3 {
		t.Errorf("%d evidence lines, want 3:\n%s", n, out)
	}

	buf.Reset()
	if err := wiped("redis").run(t).WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "admitted by the docs") || !strings.Contains(out, "PASS") {
		t.Errorf("text report of an admitted run:\n%s", out)
	}
}

func TestReportJSON(t *testing.T) {
	r := wiped("etcd").run(t)
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Backend    string
		Failed     bool
		Verdict    string
		Grants     int
		Classes    []Class
		Violations []Violation
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, buf.String())
	}
	if got.Backend != "etcd" || !got.Failed || !strings.HasPrefix(got.Verdict, "FAIL") || got.Grants != 2 ||
		len(got.Classes) != len(AllClasses) || len(got.Violations) != 2 {
		t.Errorf("decoded %+v", got)
	}

	// an empty history is a valid, passing report
	buf.Reset()
	if err := Analyze(&History{Backend: "mem"}).WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"violations": []`) || !strings.Contains(buf.String(), `"failed": false`) {
		t.Errorf("empty report: %s", buf.String())
	}
}

// Malformed histories (events without a request, unknown kinds, a fault
// that never ends, zero TTL) give a report, never a panic.
func TestAnalyzeOdd(t *testing.T) {
	h := &History{Backend: "redis", Events: []Event{
		{Kind: KindWrite, Mono: 5, Worker: 3, Op: 9, Token: 1},
		{Kind: KindGrant, Mono: 1, Worker: 0, Lock: "x", Token: 2},
		{Kind: KindGrant, Mono: 2, Worker: 0, Lock: "x", Token: 3},
		{Kind: "bogus", Mono: 3},
		{Kind: KindFaultStart, Mono: 4, Worker: -1, Fault: FaultKillHolder, Target: "worker zero"},
		{Kind: KindUnlockEnd, Mono: 6, Worker: 7},
	}}
	r := Analyze(h)
	if r.Grants != 2 || r.Writes != 1 || r.Faults != 1 {
		t.Errorf("%+v", r)
	}
	var buf bytes.Buffer
	if err := r.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(&buf, h, r); err != nil {
		t.Fatal(err)
	}
	if r := Analyze(nil); r.Failed() || r.Grants != 0 {
		t.Errorf("Analyze(nil) = %+v", r)
	}
	if err := WriteHTML(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// The table in docs/backends.md ("What the checker admits") and the
// admissions list say the same.
func TestAdmissionsMatchDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/backends.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "## What the checker admits")
	if i < 0 {
		t.Fatal("docs/backends.md has no section \"What the checker admits\"")
	}
	doc = doc[i:]
	if j := strings.Index(doc[3:], "\n## "); j >= 0 {
		doc = doc[:j+3]
	}
	key := func(fault, backend string, classes []string) string {
		slices.Sort(classes)
		return fault + " " + backend + " " + strings.Join(classes, ",")
	}
	var fromDoc []string
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		fault := strings.Trim(strings.TrimSpace(cells[1]), "`")
		var classes []string
		for _, c := range strings.Split(cells[3], ",") {
			classes = append(classes, strings.TrimSpace(c))
		}
		for _, item := range strings.Split(cells[2], ", ") {
			kind, modes, _ := strings.Cut(strings.TrimSpace(item), " ")
			kind = strings.Trim(kind, "`")
			if modes == "" {
				fromDoc = append(fromDoc, key(fault, kind, slices.Clone(classes)))
				continue
			}
			for _, m := range strings.Split(modes, " and ") {
				fromDoc = append(fromDoc, key(fault, kind+"/"+strings.TrimSpace(m), slices.Clone(classes)))
			}
		}
	}
	var fromCode []string
	for _, a := range admissions {
		for _, b := range a.backends {
			fromCode = append(fromCode, key(a.fault, b, slices.Clone(a.classes)))
		}
	}
	slices.Sort(fromDoc)
	slices.Sort(fromCode)
	if !slices.Equal(fromDoc, fromCode) {
		t.Errorf("docs/backends.md admits\n  %s\nadmit.go admits\n  %s", strings.Join(fromDoc, "\n  "), strings.Join(fromCode, "\n  "))
	}
}

// While the workers are being stopped, a waiter left without a holder is not
// a liveness violation.
func TestAnalyzeLivenessStop(t *testing.T) {
	b := newHB("postgres", 100*time.Millisecond)
	b.hold(0, 1, 0, 0, 100, 1, 100)
	b.req(1, 1, 50) // never answered: the run stopped
	b.h.Stop = ms(150)
	b.ev(Event{Kind: KindDone, Mono: ms(2000), Worker: 2, Lock: "b", Op: 9})
	want(t, b.run(t), nil)
	b.h.Stop = 0
	want(t, b.run(t), map[string]int{ClassLiveness: 1})
}

// A grant recorded late, by a worker stopped between Lock's return and the
// record, whose holder read no validity left, believed nothing: it is no
// overlap, and an Unlock after it is not late. Seen in a postgres/advisory
// pause-holder run as a grant of token 426 recorded 24 ms after a grant of
// token 458. The same history with validity left is still a violation
// (validity-overlap), though not a late unlock: the Unlock that succeeded
// released token 458, the newest grant (TestAnalyzeLateUnlockOlderGrant).
func TestAnalyzeStillbornGrant(t *testing.T) {
	build := func(validUntil int) *hb {
		b := newHB("postgres", time.Second)
		b.req(0, 1, 0).req(1, 1, 50)
		b.grant(1, 1, 1000, 458, 1030)
		b.grant(0, 1, 1024, 426, validUntil).unlock(0, 1, 1025, 1026, "not held")
		return b.unlock(1, 1, 1029, 1031, "")
	}
	want(t, build(1024).run(t), map[string]int{})
	r := build(1500).run(t)
	want(t, r, map[string]int{ClassValidityOverlap: 1})
	for _, v := range r.Violations {
		if v.Class == ClassValidityOverlap && !strings.Contains(v.Evidence, "read its own lease valid for") {
			t.Errorf("evidence %q does not say what validity the later grant read", v.Evidence)
		}
	}
}

// A grant observed after another one but carrying a smaller token was made
// by the server before it (its reply was slower): when a clock jump expired
// that older lease and the lock went to a newer owner, the newer owner's
// Unlock of its own grant is no late unlock (mysql lease, clock-jump: "w1
// op 18 (token 37) started Unlock at 1.067s and it returned nil …, but w0
// op 19 had been granted token 36 at 1.050s").
func TestAnalyzeLateUnlockOlderGrant(t *testing.T) {
	b := newHB("sqlite", time.Second)
	b.fault(FaultClockJump, "server clock +2s", 40, 45)
	b.req(0, 1, 0).req(1, 1, 10)
	b.grant(1, 1, 49, 37, 1049)
	b.grant(0, 1, 50, 36, 1050) // granted first (token 36), its reply came last
	b.unlock(1, 1, 67, 68, "")  // the newest grant's own release
	b.unlock(0, 1, 100, 101, "dlock: lock is not held by this owner")
	r := b.run(t)
	if n, _ := count(r, ClassLateUnlock); n != 0 {
		for _, v := range r.Violations {
			t.Logf("%s: %s", v.Class, v.Evidence)
		}
		t.Fatalf("late-unlock: %d, want 0: token 36 was granted before token 37", n)
	}
}
