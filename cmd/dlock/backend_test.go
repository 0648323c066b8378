package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testserver"
)

// TestProcessEtcdStopsAnswering: etcd is paused while CMD runs under a 2s
// lease; the lease is lost, CMD is stopped, and dlock exits 76 promptly
// once CMD is gone, saying what happened, rather than waiting for the
// unanswering backend to close.
func TestProcessEtcdStopsAnswering(t *testing.T) {
	c := testserver.Etcd(t, 1)
	dir := t.TempDir()
	ready, gone := filepath.Join(dir, "ready"), filepath.Join(dir, "gone")
	cmd, out := startDlock(t, c.URL()+"/stall/", "run", "--ttl", "2s", "--kill-grace", "1s", "job", "--", "sh", "-c",
		`trap 'touch "$1"; exit 143' TERM; touch "$0"; while :; do sleep 0.05; done`, ready, gone)
	waitFor(t, "CMD to start", 20*time.Second, fileExists(ready))
	if err := c.Members[0].Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Members[0].Resume() })
	waitFor(t, "CMD to be stopped", 20*time.Second, fileExists(gone))
	stopped := time.Now()
	code := waitExit(t, cmd, 20*time.Second)
	if code != exitLeaseLost {
		t.Fatalf("exit %d, want 76; output %s", code, out)
	}
	if el := time.Since(stopped); el > 2*time.Second {
		t.Errorf("dlock exited %v after CMD was stopped, want at once; output %s", el, out)
	}
	if s := out.String(); !strings.Contains(s, `lease lost on "job"`) || !strings.Contains(s, "backend is not answering") {
		t.Errorf("output %q does not say the lease was lost and the backend is not answering", s)
	}
}
