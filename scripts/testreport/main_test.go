package main

import (
	"bufio"
	"regexp"
	"strings"
	"testing"
)

const passingRun = `{"Action":"start","Package":"example.com/m/redislock"}
{"Action":"run","Package":"example.com/m/redislock","Test":"TestA"}
{"Action":"output","Package":"example.com/m/redislock","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"example.com/m/redislock","Test":"TestA","Output":"--- PASS: TestA (0.10s)\n"}
{"Action":"pass","Package":"example.com/m/redislock","Test":"TestA","Elapsed":0.1}
{"Action":"run","Package":"example.com/m/redislock","Test":"TestA/sub"}
{"Action":"pass","Package":"example.com/m/redislock","Test":"TestA/sub","Elapsed":0}
{"Action":"output","Package":"example.com/m/redislock","Output":"PASS\n"}
{"Action":"output","Package":"example.com/m/redislock","Output":"ok  \texample.com/m/redislock\t0.2s\n"}
{"Action":"pass","Package":"example.com/m/redislock","Elapsed":0.2}
`

const skipInBackend = `{"Action":"run","Package":"example.com/m/pglock","Test":"TestB"}
{"Action":"output","Package":"example.com/m/pglock","Test":"TestB","Output":"=== RUN   TestB\n"}
{"Action":"output","Package":"example.com/m/pglock","Test":"TestB","Output":"    pg_test.go:9: testserver: server program not installed: initdb\n"}
{"Action":"output","Package":"example.com/m/pglock","Test":"TestB","Output":"--- SKIP: TestB (0.00s)\n"}
{"Action":"skip","Package":"example.com/m/pglock","Test":"TestB","Elapsed":0}
{"Action":"output","Package":"example.com/m/pglock","Output":"ok  \texample.com/m/pglock\t0.1s\n"}
{"Action":"pass","Package":"example.com/m/pglock","Elapsed":0.1}
`

const skipElsewhere = `{"Action":"run","Package":"example.com/m","Test":"TestC"}
{"Action":"output","Package":"example.com/m","Test":"TestC","Output":"--- SKIP: TestC (0.00s)\n"}
{"Action":"skip","Package":"example.com/m","Test":"TestC","Elapsed":0}
{"Action":"output","Package":"example.com/m","Output":"ok  \texample.com/m\t0.1s\n"}
{"Action":"pass","Package":"example.com/m","Elapsed":0.1}
`

const failingRun = `{"Action":"run","Package":"example.com/m","Test":"TestD"}
{"Action":"output","Package":"example.com/m","Test":"TestD","Output":"=== RUN   TestD\n"}
{"Action":"output","Package":"example.com/m","Test":"TestD","Output":"    d_test.go:3: boom\n"}
{"Action":"output","Package":"example.com/m","Test":"TestD","Output":"--- FAIL: TestD (0.00s)\n"}
{"Action":"fail","Package":"example.com/m","Test":"TestD","Elapsed":0}
{"Action":"output","Package":"example.com/m","Output":"FAIL\n"}
{"Action":"output","Package":"example.com/m","Output":"FAIL\texample.com/m\t0.1s\n"}
{"Action":"fail","Package":"example.com/m","Elapsed":0.1}
`

const leakOnly = `{"Action":"run","Package":"example.com/m","Test":"TestE"}
{"Action":"pass","Package":"example.com/m","Test":"TestE","Elapsed":0}
{"Action":"output","Package":"example.com/m","Output":"goleak: Errors on successful test run: found unexpected goroutines\n"}
{"Action":"output","Package":"example.com/m","Output":"FAIL\texample.com/m\t0.1s\n"}
{"Action":"fail","Package":"example.com/m","Elapsed":0.1}
`

const byDesignSkip = `{"Action":"run","Package":"example.com/m/etcdlock","Test":"TestConformance/ExtendAndNoRenew"}
{"Action":"output","Package":"example.com/m/etcdlock","Test":"TestConformance/ExtendAndNoRenew","Output":"    conformance.go:460: session-bound backend: a lease lives as long as its session\n"}
{"Action":"skip","Package":"example.com/m/etcdlock","Test":"TestConformance/ExtendAndNoRenew","Elapsed":0}
{"Action":"run","Package":"example.com/m/etcdlock","Test":"TestFailover"}
{"Action":"output","Package":"example.com/m/etcdlock","Test":"TestFailover","Output":"    testserver: server program not installed: etcd (session-bound backend)\n"}
{"Action":"skip","Package":"example.com/m/etcdlock","Test":"TestFailover","Elapsed":0}
`

// Two packages' events interleave, as go test -json streams them.
const interleaved = `{"Action":"run","Package":"example.com/m/a","Test":"TestA"}
{"Action":"run","Package":"example.com/m/b","Test":"TestB"}
{"Action":"output","Package":"example.com/m/b","Test":"TestB","Output":"    b_test.go:1: b failed\n"}
{"Action":"output","Package":"example.com/m/a","Test":"TestA","Output":"    a_test.go:1: a failed\n"}
{"Action":"fail","Package":"example.com/m/b","Test":"TestB","Elapsed":0}
{"Action":"fail","Package":"example.com/m/a","Test":"TestA","Elapsed":0}
{"Action":"output","Package":"example.com/m/a","Output":"FAIL\texample.com/m/a\t0.1s\n"}
{"Action":"fail","Package":"example.com/m/a","Elapsed":0.1}
{"Action":"output","Package":"example.com/m/b","Output":"FAIL\texample.com/m/b\t0.1s\n"}
{"Action":"fail","Package":"example.com/m/b","Elapsed":0.1}
`

func TestReportKeepsPackagesTogether(t *testing.T) {
	_, out := runReport(t, interleaved, false)
	want := "    a_test.go:1: a failed\nFAIL\texample.com/m/a\t0.1s\n    b_test.go:1: b failed\nFAIL\texample.com/m/b\t0.1s\n"
	if !strings.HasPrefix(out, want) {
		t.Fatalf("output:\n%s\nwant it to start with:\n%s", out, want)
	}
}

func runReport(t *testing.T, input string, ci bool) (int, string) {
	t.Helper()
	var sb strings.Builder
	w := bufio.NewWriter(&sb)
	r := &report{out: w, ci: ci, backends: splitList(defaultBackends), allow: regexp.MustCompile(`session-bound backend`)}
	code := r.run(strings.NewReader(input))
	w.Flush()
	return code, sb.String()
}

func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

func TestReport(t *testing.T) {
	tests := []struct {
		name     string
		input    string
		ci       bool
		code     int
		summary  string
		contains []string
		absent   []string
	}{
		{"pass", passingRun, true, 0, "2 passed, 0 failed, 0 skipped",
			[]string{"--- PASS: TestA (0.10s)", "ok  \texample.com/m/redislock\t0.2s"}, []string{"TestA/sub", "=== RUN", "\nPASS\n"}},
		{"backend skip outside CI", skipInBackend, false, 0, "0 passed, 0 failed, 1 skipped",
			[]string{"--- SKIP: TestB", "not installed"}, []string{"CI=true"}},
		{"backend skip in CI", skipInBackend, true, 1, "0 passed, 0 failed, 1 skipped",
			[]string{"CI=true and tests were skipped", "example.com/m/pglock TestB: pg_test.go:9: testserver: server program not installed: initdb"}, nil},
		{"non-backend skip in CI", skipElsewhere, true, 0, "0 passed, 0 failed, 1 skipped", nil, nil},
		{"failure", failingRun, false, 1, "0 passed, 1 failed, 0 skipped",
			[]string{"d_test.go:3: boom", "--- FAIL: TestD", "FAIL\texample.com/m\t0.1s"}, nil},
		{"package failure without a failed test", leakOnly, false, 1, "1 passed, 1 failed, 0 skipped",
			[]string{"goleak: Errors"}, nil},
		{"by-design skip allowed, testserver skip never", byDesignSkip, true, 1, "0 passed, 0 failed, 2 skipped",
			[]string{"example.com/m/etcdlock TestFailover: testserver: server program not installed"},
			[]string{"etcdlock TestConformance/ExtendAndNoRenew:"}},
		{"no input", "", false, 1, "0 passed, 0 failed, 0 skipped", []string{"no test events"}, nil},
		{"backend without tests in CI", `{"Action":"skip","Package":"example.com/m/zklock"}` + "\n", true, 1, "0 passed, 0 failed, 0 skipped",
			[]string{"example.com/m/zklock: no test files"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runReport(t, tc.input, tc.ci)
			if code != tc.code {
				t.Errorf("exit code %d, want %d\n%s", code, tc.code, out)
			}
			last := lastLines(out, 2)
			if tc.code == 0 {
				if last[1] != tc.summary {
					t.Errorf("last line %q, want %q", last[1], tc.summary)
				}
			} else if last[0] != tc.summary || last[1] != "FAIL" {
				t.Errorf("last lines %q, want %q then FAIL", last, tc.summary)
			}
			for _, c := range tc.contains {
				if !strings.Contains(out, c) {
					t.Errorf("output lacks %q:\n%s", c, out)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(out, a) {
					t.Errorf("output has %q:\n%s", a, out)
				}
			}
		})
	}
}
