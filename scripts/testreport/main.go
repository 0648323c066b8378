// Command testreport reads `go test -json` on standard input and prints a
// report that reads like go test's own output: a `--- PASS` line per
// top-level test, the full output of every failed or skipped test, and the
// packages' closing `ok` / `FAIL` lines. It ends with a summary line
//
//	N passed, N failed, N skipped
//
// and, when the run failed, a last `FAIL` line. The exit status is 1 when any
// test or package failed.
//
// When CI is "true" (or -ci is given), a skipped test in a backend package
// (one whose import path ends in a name listed by -backends) also fails the
// run: backend suites skip when their server is missing, and in CI a missing
// server must never pass as green. Skips that are part of a suite's design
// (a conformance case that does not apply to a backend) are let through when
// their message matches the -allow regular expression; a skip raised by
// internal/testserver (its messages start with "testserver:") never is.
//
// Usage:
//
//	go test -race -json ./... | go run ./scripts/testreport
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// defaultBackends are the packages that talk to real servers.
const defaultBackends = "sqlitelock,redislock,redlock,etcdlock,zklock,pglock,mysqllock,internal/testserver,internal/acceptance,check"

func main() {
	ci := flag.Bool("ci", os.Getenv("CI") == "true" || os.Getenv("CI") == "1", "fail on skipped tests in backend packages (default: $CI is true)")
	backends := flag.String("backends", defaultBackends, "comma-separated import-path suffixes of backend packages")
	allow := flag.String("allow", "", "regular expression matching the messages of by-design skips that CI accepts in backend packages")
	verbose := flag.Bool("v", false, "print every test's output, as go test -v does")
	flag.Parse()
	r := &report{
		out:      bufio.NewWriter(os.Stdout),
		ci:       *ci,
		verbose:  *verbose,
		backends: splitList(*backends),
	}
	if *allow != "" {
		re, err := regexp.Compile(*allow)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testreport: -allow: %v\n", err)
			os.Exit(2)
		}
		r.allow = re
	}
	code := r.run(os.Stdin)
	r.out.Flush()
	os.Exit(code)
}

// event is one line of test2json output.
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type key struct{ pkg, test string }

type report struct {
	out      *bufio.Writer
	ci       bool
	verbose  bool
	backends []string
	allow    *regexp.Regexp // by-design skips CI accepts; nil accepts none

	buf                     map[key][]string            // output per running test
	pkgOut                  map[string]*strings.Builder // report lines per running package
	passed, failed, skipped int
	failedPkgs              map[string]bool
	pkgFailedTests          map[string]int
	ciSkips                 []string // "pkg TestName: reason"
	events                  int
}

func (r *report) run(in io.Reader) int {
	r.buf = map[key][]string{}
	r.pkgOut = map[string]*strings.Builder{}
	r.failedPkgs = map[string]bool{}
	r.pkgFailedTests = map[string]int{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(r.out, string(line)) // not test2json: pass it through
			continue
		}
		r.events++
		r.handle(e)
		if r.verbose {
			r.out.Flush()
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(r.out, "testreport: reading input: %v\n", err)
		r.failed++
	}
	return r.finish()
}

// printf writes a report line for pkg. Packages run in parallel and their
// events interleave, so lines are held per package and printed together when
// the package ends, as go test prints them.
func (r *report) printf(pkg, format string, args ...any) {
	if r.verbose || pkg == "" {
		fmt.Fprintf(r.out, format, args...)
		return
	}
	b := r.pkgOut[pkg]
	if b == nil {
		b = &strings.Builder{}
		r.pkgOut[pkg] = b
	}
	fmt.Fprintf(b, format, args...)
}

// endPackage prints what was held for pkg.
func (r *report) endPackage(pkg string) {
	if b := r.pkgOut[pkg]; b != nil {
		fmt.Fprint(r.out, b.String())
		delete(r.pkgOut, pkg)
	}
}

func (r *report) handle(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		r.printf(e.Package, "%s", e.Output)
	case "build-fail":
		r.failedPkgs[e.Package] = true
	case "output":
		if r.verbose {
			fmt.Fprint(r.out, e.Output)
			return
		}
		if e.Test != "" {
			r.buf[k] = append(r.buf[k], e.Output)
			return
		}
		// Package-level output: closing lines, panics, leak reports.
		if t := strings.TrimSpace(e.Output); t == "PASS" || strings.HasPrefix(t, "=== ") {
			return
		}
		r.printf(e.Package, "%s", e.Output)
	case "pass":
		if e.Test == "" {
			r.endPackage(e.Package)
			return
		}
		r.passed++
		if !r.verbose && !strings.Contains(e.Test, "/") {
			r.printf(e.Package, "--- PASS: %s (%.2fs)\n", e.Test, e.Elapsed)
		}
		delete(r.buf, k)
	case "fail":
		if e.Test == "" {
			r.failedPkgs[e.Package] = true
			r.endPackage(e.Package)
			return
		}
		r.failed++
		r.pkgFailedTests[e.Package]++
		r.flush(k)
	case "skip":
		if e.Test == "" {
			// A package with no test files.
			if r.ci && r.isBackend(e.Package) {
				r.ciSkips = append(r.ciSkips, e.Package+": no test files")
			}
			r.endPackage(e.Package)
			return
		}
		r.skipped++
		if reason := skipReason(r.buf[k]); r.ci && r.isBackend(e.Package) && !r.allowed(reason) {
			r.ciSkips = append(r.ciSkips, e.Package+" "+e.Test+": "+reason)
		}
		r.flush(k)
	}
}

// flush prints a finished test's output without go test's progress lines.
func (r *report) flush(k key) {
	for _, l := range r.buf[k] {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "=== RUN") || strings.HasPrefix(t, "=== PAUSE") || strings.HasPrefix(t, "=== CONT") || strings.HasPrefix(t, "=== NAME") {
			continue
		}
		r.printf(k.pkg, "%s", l)
	}
	delete(r.buf, k)
}

func (r *report) finish() int {
	// Packages that never ended (go test was killed): print what they had.
	var open []string
	for p := range r.pkgOut {
		open = append(open, p)
	}
	sort.Strings(open)
	for _, p := range open {
		r.endPackage(p)
	}
	code := 0
	if r.events == 0 {
		fmt.Fprintln(r.out, "testreport: no test events on input (did go test run with -json?)")
		code = 1
	}
	// A package can fail with no failed test: a build error, a panic in
	// TestMain, a goroutine leak. Count each such package once.
	var pkgOnly []string
	for p := range r.failedPkgs {
		if r.pkgFailedTests[p] == 0 {
			pkgOnly = append(pkgOnly, p)
		}
	}
	sort.Strings(pkgOnly)
	r.failed += len(pkgOnly)
	if r.failed > 0 {
		code = 1
	}
	if len(r.ciSkips) > 0 {
		fmt.Fprintln(r.out, "\nFAIL: CI=true and tests were skipped in backend packages (a missing server must not pass as green):")
		for _, s := range r.ciSkips {
			fmt.Fprintln(r.out, "    "+s)
		}
		code = 1
	}
	fmt.Fprintf(r.out, "\n%d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped)
	if code != 0 {
		fmt.Fprintln(r.out, "FAIL")
	}
	return code
}

// allowed reports whether a skip message is a by-design skip CI accepts.
func (r *report) allowed(reason string) bool {
	if r.allow == nil || strings.Contains(reason, "testserver:") {
		return false
	}
	return r.allow.MatchString(reason)
}

func (r *report) isBackend(pkg string) bool {
	for _, b := range r.backends {
		if pkg == b || strings.HasSuffix(pkg, "/"+b) {
			return true
		}
	}
	return false
}

// skipReason picks the message of a skipped test from its output.
func skipReason(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		msg = append(msg, t)
	}
	if len(msg) == 0 {
		return "(no message)"
	}
	return strings.Join(msg, " ")
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
