package check

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCommand re-executes the test binary as a worker (see TestMain).
func testCommand(t testing.TB) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe}
}

// runCheck runs the checker with small defaults and analyses the history.
func runCheck(t *testing.T, cfg Config) (*History, *Report) {
	t.Helper()
	cfg.WorkerCommand = testCommand(t)
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if cfg.Goroutines == 0 {
		cfg.Goroutines = 2
	}
	if cfg.Duration == 0 {
		cfg.Duration = 6 * time.Second
	}
	start := time.Now()
	h, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	rep := Analyze(h)
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %v in %v:\n%s", h.Backend, cfg.Faults, time.Since(start).Round(time.Millisecond), b.String())
	return h, rep
}

func TestRunSQLite(t *testing.T) {
	dir := t.TempDir()
	h, rep := runCheck(t, Config{URL: "sqlite://" + filepath.Join(dir, "l.db"), Faults: []string{FaultKillHolder, FaultPauseHolder}})
	if rep.Failed() {
		t.Errorf("violations on sqlite")
	}
	if rep.Grants == 0 || rep.Writes == 0 {
		t.Errorf("grants %d writes %d: the workload did not run", rep.Grants, rep.Writes)
	}
	if rep.Faults == 0 {
		t.Errorf("no fault was injected")
	}
	_ = h
}

// TestRunDetectsCrash: a worker that exits abnormally (not killed by a
// fault) is reported as a panic, which fails the run.
func TestRunDetectsCrash(t *testing.T) {
	t.Setenv(crashEnv, "1")
	_, rep := runCheck(t, Config{URL: "sqlite://" + filepath.Join(t.TempDir(), "l.db"), Workers: 1, Duration: 2 * time.Second})
	if !rep.Failed() {
		t.Fatal("a crashed worker passed the run")
	}
	for _, c := range rep.Classes {
		if c.Name == ClassPanic && (c.Count == 0 || !strings.Contains(strings.Join(c.Evidence, " "), "exit status 3")) {
			t.Errorf("panic class %+v, want the worker's exit status 3", c)
		}
	}
}
