package check

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// The violation classes Analyze reports, in the order reports list them.
// Each is a promise dlock makes (docs/backends.md) that the history shows
// broken.
const (
	// ClassValidityOverlap: another owner was granted the lock while a
	// holder still believed its own lease valid: the holder's validity
	// deadline had not passed, Done had not closed and Unlock had not
	// started. dlock promises that loss is signalled before hand-over.
	ClassValidityOverlap = "validity-overlap"
	// ClassUnsafeWrite: a holder wrote to the resource after another owner
	// with a larger token had been granted the lock, while the writer's own
	// lease was still valid by the deadline it read just before the write
	// (and Done had not closed). Whether the fence accepted the write is in
	// the evidence; the write is a violation either way, since the writer
	// was entitled to believe it held the lock.
	ClassUnsafeWrite = "unsafe-write"
	// ClassTokenOrder: a grant whose request was sent after another grant of
	// the same lock had been received carries a token that is not strictly
	// greater than that grant's token.
	ClassTokenOrder = "token-order"
	// ClassDuplicateToken: two different grants (different Lock calls) of
	// one lock carry the same token.
	ClassDuplicateToken = "duplicate-token"
	// ClassLateUnlock: an Unlock returned nil although another owner had
	// been granted the lock after this lease's grant (with a greater
	// token, when both are known: a grant whose reply came later but whose
	// token is smaller was made first) and before the Unlock started:
	// release is owner-checked, so it must have reported ErrNotHeld.
	ClassLateUnlock = "late-unlock"
	// ClassLiveness: for longer than 2×TTL + LockDelay a lock had waiters
	// (requests sent and not yet answered) and no holder (no lease granted
	// and not yet ended by Done or the end of its Unlock), outside the
	// windows of injected faults and their recovery (see FaultRecovery),
	// and before History.Stop when the history records it.
	ClassLiveness = "liveness"
	// ClassLeak: a worker still had goroutines or connections after
	// Client.Close (a KindLeak event).
	ClassLeak = "leak"
	// ClassPanic: a worker panicked or exited abnormally (a KindPanic
	// event).
	ClassPanic = "panic"
)

// AllClasses lists every violation class in report order.
var AllClasses = []string{
	ClassValidityOverlap, ClassUnsafeWrite, ClassTokenOrder, ClassDuplicateToken,
	ClassLateUnlock, ClassLiveness, ClassLeak, ClassPanic,
}

// FaultRecovery is how long after a fault's end its effects may still be
// seen: the run's TTL plus its lock-delay (a lease taken before or during the
// fault, or a server-side lease of a killed holder, runs out) plus a margin
// of one TTL or one second, whichever is longer (clients reconnect, elect,
// retry). Liveness is not judged inside [fault start, fault end +
// FaultRecovery], and admitted violations must touch that window.
func FaultRecovery(h *History) time.Duration {
	return h.TTL + h.LockDelay + max(h.TTL, time.Second)
}

// LivenessBound is the longest a lock may have waiters and no holder outside
// fault windows: 2×TTL + LockDelay.
func LivenessBound(h *History) time.Duration {
	return 2*h.TTL + h.LockDelay
}

// OpRef names one Lock attempt: (Worker, Goroutine, Op), and the token it was
// granted (0 if none).
type OpRef struct {
	Worker    int    `json:"worker"`
	Goroutine int    `json:"goroutine"`
	Op        int64  `json:"op"`
	Token     uint64 `json:"token,omitempty"`
}

func (o OpRef) String() string {
	return fmt.Sprintf("w%d/g%d op %d", o.Worker, o.Goroutine, o.Op)
}

// Violation is one broken promise found in a history.
type Violation struct {
	// Class is one of the Class* constants.
	Class string `json:"class"`
	// Lock is the lock's name ("" for leak and panic).
	Lock string `json:"lock,omitempty"`
	// From and At bound the violation on the Mono clock: At is when it
	// became visible (the second grant, the write, the Unlock's end, the end
	// of a liveness stretch), From when its first ingredient happened (the
	// first grant, the start of the stretch).
	From int64 `json:"from"`
	At   int64 `json:"at"`
	// Ops are the Lock attempts involved, the earlier holder first.
	Ops []OpRef `json:"ops,omitempty"`
	// Evidence says what happened, with times in seconds from the run's
	// start.
	Evidence string `json:"evidence"`
	// Admitted is set when docs/backends.md admits this violation for the
	// run's backend under a fault whose window it touches; AdmittedBy then
	// names the fault and the reason.
	Admitted   bool   `json:"admitted"`
	AdmittedBy string `json:"admitted_by,omitempty"`
}

// analysis holds the indexed history while Analyze works.
type analysis struct {
	h       *History
	events  []Event
	leases  []*lease
	byLock  map[string][]*lease // granted leases, by grant time
	windows []faultWindow
	deaths  map[int][]death // worker → when it was killed or panicked
	start   int64
	end     int64
	rep     *Report
}

// Analyze checks a run's history against dlock's guarantees and returns the
// report: counts, every violation found (see the Class* constants for what
// each class means precisely), and which of them docs/backends.md admits for
// the run's backend under the faults injected (see Admission). The history is
// not modified. Events recorded late never produce a violation by
// themselves: a grant is recorded after the server granted it, Done and the
// end of an Unlock after they happened, and a holder's belief is bounded by
// the validity deadline it actually read, so recording lag can only hide a
// violation, never invent one. A nil history is an empty one.
func Analyze(h *History) *Report {
	if h == nil {
		h = &History{}
	}
	a := &analysis{h: h, byLock: map[string][]*lease{}, deaths: map[int][]death{}}
	a.rep = &Report{Backend: h.Backend, URL: h.URL, TTL: h.TTL, LockDelay: h.LockDelay,
		Workers: h.Workers, Goroutines: h.Goroutines, Locks: len(h.Locks),
		FaultNames: slices.Clone(h.Faults)}
	a.index()
	a.checkOverlap()
	a.checkWrites()
	a.checkTokens()
	a.checkLateUnlock()
	a.checkLiveness()
	a.checkEvents()
	a.countOverlaps()
	a.admit()
	a.rep.summarise()
	return a.rep
}

// secs formats a Mono time as seconds from the run's start.
func (a *analysis) secs(t int64) string {
	return fmt.Sprintf("%.3fs", float64(t-a.start)/1e9)
}

func (a *analysis) add(v Violation) { a.rep.Violations = append(a.rep.Violations, v) }

// locks returns the lock names that have grants, sorted.
func (a *analysis) locks() []string {
	var ns []string
	for n := range a.byLock {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

func dur(ns int64) string { return time.Duration(ns).Round(time.Millisecond).String() }

func (a *analysis) checkEvents() {
	for _, e := range a.events {
		switch e.Kind {
		case KindLeak:
			a.add(Violation{Class: ClassLeak, From: e.Mono, At: e.Mono,
				Ops:      []OpRef{{Worker: e.Worker, Goroutine: e.Goroutine}},
				Evidence: fmt.Sprintf("worker %d at %s: %s", e.Worker, a.secs(e.Mono), e.Err)})
		case KindPanic:
			a.add(Violation{Class: ClassPanic, From: e.Mono, At: e.Mono,
				Ops:      []OpRef{{Worker: e.Worker, Goroutine: e.Goroutine}},
				Evidence: fmt.Sprintf("worker %d at %s: %s", e.Worker, a.secs(e.Mono), firstLine(e.Err))})
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

func (a *analysis) admit() {
	rec := int64(FaultRecovery(a.h))
	for i := range a.rep.Violations {
		v := &a.rep.Violations[i]
		for _, w := range a.windows {
			why, ok := Admission(a.h.Backend, a.h.URL, w.fault, v.Class)
			if !ok {
				continue
			}
			if v.From <= w.end+rec && v.At >= w.start {
				v.Admitted = true
				v.AdmittedBy = w.fault + ": " + why
				break
			}
		}
	}
}
