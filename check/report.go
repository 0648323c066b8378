package check

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// EvidenceKept is how many pieces of evidence a Class keeps (the text table
// prints the first three of them).
const EvidenceKept = 5

// Class sums up one violation class in a Report.
type Class struct {
	// Name is one of the Class* constants.
	Name string `json:"name"`
	// Count is how many violations of this class were found; Unadmitted
	// how many of them docs/backends.md does not admit.
	Count      int `json:"count"`
	Unadmitted int `json:"unadmitted"`
	// Admitted is true when Count > 0 and every violation of the class is
	// admitted by the docs; Why then gives the first admission's reason.
	Admitted bool   `json:"admitted"`
	Why      string `json:"why,omitempty"`
	// Evidence is the first few violations' evidence, those the docs do not
	// admit first.
	Evidence []string `json:"evidence,omitempty"`
}

// Report is the verdict on one run's History (see Analyze).
type Report struct {
	// Backend and URL (password removed) as the history has them; TTL and
	// LockDelay the lease options; Workers, Goroutines and Locks the
	// workload's shape.
	Backend    string        `json:"backend"`
	URL        string        `json:"url,omitempty"`
	TTL        time.Duration `json:"ttl"`
	LockDelay  time.Duration `json:"lock_delay"`
	Workers    int           `json:"workers"`
	Goroutines int           `json:"goroutines"`
	Locks      int           `json:"locks"`
	// Start and End bound the run on the Mono clock.
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	// Faults is how many faults were injected (fault_start events);
	// FaultNames the fault kinds the run used.
	Faults     int      `json:"faults"`
	FaultNames []string `json:"fault_names,omitempty"`
	// Grants counts Lock calls that returned a lease, AcquireErrors those
	// that returned an error, Writes the critical-section writes that
	// reached the fenced resource and FenceRejected those it refused.
	Grants        int `json:"grants"`
	AcquireErrors int `json:"acquire_errors"`
	Writes        int `json:"writes"`
	FenceRejected int `json:"fence_rejected"`
	// UnfencedOverlaps counts pairs of critical sections of one lock that
	// overlapped in time (each from its grant to its last write), whatever
	// the fence did: the collisions an unfenced resource would have seen.
	// Not a violation by itself.
	UnfencedOverlaps int `json:"unfenced_overlaps"`
	// Classes has one entry per violation class, in AllClasses order.
	Classes []Class `json:"classes"`
	// Violations lists every violation found, in the order of the checks.
	Violations []Violation `json:"violations"`
}

// summarise fills Classes from Violations.
func (r *Report) summarise() {
	r.Classes = r.Classes[:0]
	for _, name := range AllClasses {
		c := Class{Name: name}
		var admitted []string
		for _, v := range r.Violations {
			if v.Class != name {
				continue
			}
			c.Count++
			if v.Admitted {
				if c.Why == "" {
					c.Why = v.AdmittedBy
				}
				admitted = append(admitted, v.Evidence)
				continue
			}
			c.Unadmitted++
			if len(c.Evidence) < EvidenceKept {
				c.Evidence = append(c.Evidence, v.Evidence)
			}
		}
		for _, e := range admitted {
			if len(c.Evidence) >= EvidenceKept {
				break
			}
			c.Evidence = append(c.Evidence, e)
		}
		c.Admitted = c.Count > 0 && c.Unadmitted == 0
		if !c.Admitted {
			c.Why = ""
		}
		r.Classes = append(r.Classes, c)
	}
}

// Failed reports whether a violation occurred that the docs do not admit:
// the run breaks a promise the backend makes.
func (r *Report) Failed() bool {
	for _, v := range r.Violations {
		if !v.Admitted {
			return true
		}
	}
	return false
}

// counts returns the number of violations and of admitted ones.
func (r *Report) counts() (total, admitted int) {
	for _, v := range r.Violations {
		total++
		if v.Admitted {
			admitted++
		}
	}
	return total, admitted
}

// Verdict is the one-line verdict: "PASS: …" or "FAIL: …".
func (r *Report) Verdict() string {
	total, admitted := r.counts()
	switch {
	case r.Failed():
		return fmt.Sprintf("FAIL: %d violation(s) the docs do not admit (%d admitted by the docs)", total-admitted, admitted)
	case admitted > 0:
		return fmt.Sprintf("PASS: no violation beyond the %d the docs admit", admitted)
	default:
		return "PASS: no violations"
	}
}

func (r *Report) duration() time.Duration { return time.Duration(r.End - r.Start) }

// WriteText writes the summary table: the run's shape and counts, then one
// row per violation class with its count, "admitted by the docs" or
// "VIOLATION", and the first three pieces of evidence, then the verdict.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	faults := "none"
	if len(r.FaultNames) > 0 {
		faults = strings.Join(r.FaultNames, ", ")
	}
	fmt.Fprintf(&b, "dlock check: %s", r.Backend)
	if r.URL != "" {
		fmt.Fprintf(&b, " (%s)", r.URL)
	}
	fmt.Fprintf(&b, "\n%d workers × %d goroutines × %d locks, ttl %s, lock-delay %s, %s\n",
		r.Workers, r.Goroutines, r.Locks, r.TTL, r.LockDelay, r.duration().Round(time.Millisecond))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "faults\t%s (%d injected)\n", faults, r.Faults)
	fmt.Fprintf(tw, "grants\t%d\n", r.Grants)
	fmt.Fprintf(tw, "acquire errors\t%d\n", r.AcquireErrors)
	fmt.Fprintf(tw, "writes\t%d\n", r.Writes)
	fmt.Fprintf(tw, "fence rejected\t%d\n", r.FenceRejected)
	fmt.Fprintf(tw, "unfenced overlaps\t%d\n", r.UnfencedOverlaps)
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "%-18s %5s  %s\n", "class", "count", "verdict")
	for _, c := range r.Classes {
		status := "ok"
		switch {
		case c.Admitted:
			status = "admitted by the docs"
		case c.Count > 0 && c.Unadmitted < c.Count:
			status = fmt.Sprintf("VIOLATION (%d admitted by the docs)", c.Count-c.Unadmitted)
		case c.Count > 0:
			status = "VIOLATION"
		}
		fmt.Fprintf(&b, "%-18s %5d  %s\n", c.Name, c.Count, status)
	}
	for _, c := range r.Classes {
		if c.Count == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s:\n", c.Name)
		if c.Admitted {
			fmt.Fprintf(&b, "  admitted: %s\n", c.Why)
		}
		for i, e := range c.Evidence {
			if i == 3 {
				break
			}
			fmt.Fprintf(&b, "  - %s\n", e)
		}
		if c.Count > 3 {
			fmt.Fprintf(&b, "  … and %d more\n", c.Count-min(3, len(c.Evidence)))
		}
	}
	fmt.Fprintf(&b, "\n%s\n", r.Verdict())
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one JSON object: every Report field, plus
// "failed" (Failed) and "verdict" (Verdict).
func (r *Report) WriteJSON(w io.Writer) error {
	type plain Report
	out := struct {
		plain
		Failed  bool   `json:"failed"`
		Verdict string `json:"verdict"`
	}{plain(*r), r.Failed(), r.Verdict()}
	if out.Violations == nil {
		out.Violations = []Violation{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
