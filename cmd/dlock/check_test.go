package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProcessCheck runs `dlock check` end to end on an SQLite file, as a user
// would: worker processes are the dlock binary itself, the verdict comes as
// JSON, the timeline as a self-contained HTML file, and the exit status is 0.
func TestProcessCheck(t *testing.T) {
	dir := t.TempDir()
	db := "sqlite://" + filepath.Join(dir, "check.db")
	page := filepath.Join(dir, "timeline.html")
	cmd, out := startDlock(t, db, "check", "--url", db, "--fault", "kill-holder",
		"--workers", "2", "--goroutines", "2", "--locks", "1", "--duration", "4s", "--ttl", "1s",
		"--json", "--html", page)
	if code := waitExit(t, cmd, 90*time.Second); code != 0 {
		t.Fatalf("dlock check exited %d; output:\n%s", code, out.String())
	}
	text := out.String()
	var rep struct {
		Backend string `json:"backend"`
		Grants  int    `json:"grants"`
	}
	start := strings.Index(text, "{")
	if start < 0 {
		t.Fatalf("no JSON report in the output:\n%s", text)
	}
	if err := json.NewDecoder(strings.NewReader(text[start:])).Decode(&rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, text)
	}
	if rep.Grants == 0 {
		t.Fatalf("a 4s run granted nothing: %s", text)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatalf("--html wrote nothing: %v", err)
	}
	// Self-contained: an SVG, and nothing to load (the SVG namespace URI is
	// a name, not a fetch).
	html := string(b)
	if !strings.Contains(html, "<svg") {
		t.Fatalf("timeline has no SVG (%d bytes)", len(html))
	}
	for _, ref := range []string{"src=", "<link", "url(", "@import"} {
		if strings.Contains(html, ref) {
			t.Fatalf("timeline loads something (%q): it must be self-contained", ref)
		}
	}
}

// TestProcessCheckBadInput: a fault that does not apply, or an unknown one, is
// bad input (exit 64) named in the message, and a URL's password is never
// printed.
func TestProcessCheckBadInput(t *testing.T) {
	dir := t.TempDir()
	db := "sqlite://" + filepath.Join(dir, "check.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check", "--url", db, "--fault", "no-such-fault", "--duration", "2s"}, "no-such-fault"},
		{[]string{"check", "--url", db, "--fault", "partition", "--duration", "2s"}, "partition"},
		{[]string{"check", "--url", "redis://:hunter2secret@127.0.0.1:1/0", "--fault", "restart-server", "--duration", "2s"}, "restart-server"},
	} {
		cmd, out := startDlock(t, db, tc.args...)
		code := waitExit(t, cmd, 60*time.Second)
		if code != 64 {
			t.Errorf("%v: exit %d, want 64; output:\n%s", tc.args, code, out.String())
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v: output does not name %q:\n%s", tc.args, tc.want, out.String())
		}
		if strings.Contains(out.String(), "hunter2secret") {
			t.Errorf("%v: output shows the password:\n%s", tc.args, out.String())
		}
	}
}
