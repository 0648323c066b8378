package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

func TestUsageErrors(t *testing.T) {
	mem, _ := memURL()
	for _, tc := range []struct {
		name string
		args []string
		want string // in the one-line message
	}{
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"run without args", []string{"run"}, "missing lock NAME"},
		{"run without command", []string{"run", "--url", mem, "x"}, "missing the command"},
		{"run with command after dash missing", []string{"run", "--url", mem, "x", "--"}, "missing the command"},
		{"name after dash", []string{"run", "--url", mem, "--", "x", "true"}, "must come before"},
		{"two names", []string{"run", "--url", mem, "x", "y", "--", "true"}, "one lock NAME"},
		{"empty command", []string{"run", "--url", mem, "x", "--", ""}, "empty string"},
		{"unknown flag", []string{"run", "--bogus", "x", "--", "true"}, "unknown flag: --bogus"},
		{"bad duration", []string{"run", "--ttl", "soon", "x", "--", "true"}, "--ttl"},
		{"negative ttl", []string{"run", "--url", mem, "--ttl", "-1s", "x", "--", "true"}, "--ttl must not be negative"},
		{"negative wait", []string{"run", "--url", mem, "--wait", "-1s", "x", "--", "true"}, "--wait must not be negative"},
		{"negative grace", []string{"run", "--url", mem, "--kill-grace", "-1s", "x", "--", "true"}, "--kill-grace must not be negative"},
		{"wait and no-wait", []string{"run", "--url", mem, "--wait", "1s", "--no-wait", "x", "--", "true"}, "cannot be used together"},
		{"ttl below minimum", []string{"run", "--url", mem, "--ttl", "1ms", "x", "--", "true"}, "invalid TTL"},
		{"empty name", []string{"run", "--url", mem, "", "--", "true"}, "invalid name"},
		{"control character in name", []string{"run", "--url", mem, "a\x01b", "--", "true"}, "invalid name"},
		{"bad owner", []string{"run", "--url", mem, "--owner", "has space", "x", "--", "true"}, "invalid Owner"},
		{"unknown scheme", []string{"run", "--url", "nosuch://h/x", "x", "--", "true"}, `unknown scheme "nosuch"`},
		{"no scheme", []string{"run", "--url", "just-a-path", "x", "--", "true"}, "no scheme"},
		{"unparsable url", []string{"status", "--url", "sqlite://h:port/%zz"}, "invalid url"},
		{"bad client parameter", []string{"status", "--url", mem + "?ttl=soon"}, "parameter ttl"},
		{"driver refuses url", []string{"status", "--url", "test-badurl://u:pw@h/x?bogus=1"}, `invalid url: test-badurl://u:xxxxx@h/x?bogus=1: test-badurl: unknown URL parameter "bogus"`},
		{"status two prefixes", []string{"status", "--url", mem, "a", "b"}, "at most one PREFIX"},
		{"status unknown flag", []string{"status", "--tabular"}, "unknown flag: --tabular"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestEnv(nil)
			if code := te.run(tc.args...); code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr: %s", code, exitUsage, te.stderr.String())
			}
			// The message comes first, after any warning (a password in --url).
			first := te.stderr.String()
			for strings.HasPrefix(first, "dlock: warning: ") {
				_, first, _ = strings.Cut(first, "\n")
			}
			first, _, _ = strings.Cut(first, "\n")
			if !strings.HasPrefix(first, "dlock: ") || !strings.Contains(first, tc.want) {
				t.Fatalf("first stderr line after warnings %q, want a dlock: message containing %q", first, tc.want)
			}
			if te.stdout.String() != "" {
				t.Fatalf("stdout %q, want nothing", te.stdout.String())
			}
		})
	}
}

func TestHelpDocumentsExitCodes(t *testing.T) {
	te := newTestEnv(nil)
	if code := te.run("run", "--help"); code != 0 {
		t.Fatalf("exit %d; stderr %s", code, te.stderr.String())
	}
	out := te.stdout.String()
	for _, want := range []string{"DLOCK_TOKEN", "DLOCK_NAME", "--kill-grace", "--no-wait", "64", "69", "75", "76", "128+N"} {
		if !strings.Contains(out, want) {
			t.Errorf("run --help does not mention %q", want)
		}
	}
	te = newTestEnv(nil)
	if code := te.run(); code != 0 || !strings.Contains(te.stdout.String(), "sqlite://") {
		t.Fatalf("bare dlock: exit %d, output %q", code, te.stdout.String())
	}
}

func TestDefaultURL(t *testing.T) {
	t.Run("XDG_STATE_HOME", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "my state #1?")
		te := newTestEnv(map[string]string{"XDG_STATE_HOME": state, "HOME": "/nonexistent"})
		if code := te.run("run", "x", "--", "true"); code != 0 {
			t.Fatalf("exit %d: %s", code, te.stderr.String())
		}
		if _, err := os.Stat(filepath.Join(state, "dlock", "locks.db")); err != nil {
			t.Fatalf("default database not created: %v", err)
		}
		fi, err := os.Stat(filepath.Join(state, "dlock"))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("state directory: %v, mode %v; want 0700", err, fi.Mode())
		}
	})
	t.Run("HOME fallback", func(t *testing.T) {
		home := filepath.Join(t.TempDir(), "home dir")
		// A relative XDG_STATE_HOME is ignored, as the XDG spec says.
		te := newTestEnv(map[string]string{"HOME": home, "XDG_STATE_HOME": "relative/state"})
		if code := te.run("status"); code != 0 {
			t.Fatalf("exit %d: %s", code, te.stderr.String())
		}
		if _, err := os.Stat(filepath.Join(home, ".local", "state", "dlock", "locks.db")); err != nil {
			t.Fatalf("default database not created: %v", err)
		}
	})
	t.Run("DLOCK_URL wins over the default", func(t *testing.T) {
		mem, b := memURL()
		home := t.TempDir()
		te := newTestEnv(map[string]string{"HOME": home, "DLOCK_URL": mem})
		if code := te.run("run", "x", "--", "true"); code != 0 {
			t.Fatalf("exit %d: %s", code, te.stderr.String())
		}
		if b.Calls("acquire") != 1 {
			t.Fatalf("mem backend saw %d acquires, want 1", b.Calls("acquire"))
		}
		if _, err := os.Stat(filepath.Join(home, ".local")); err == nil {
			t.Fatal("default state directory created although DLOCK_URL was set")
		}
	})
	t.Run("--url wins over DLOCK_URL", func(t *testing.T) {
		mem, b := memURL()
		te := newTestEnv(map[string]string{"DLOCK_URL": "nosuch://x"})
		if code := te.run("run", "--url", mem, "x", "--", "true"); code != 0 {
			t.Fatalf("exit %d: %s", code, te.stderr.String())
		}
		if b.Calls("acquire") != 1 {
			t.Fatalf("mem backend saw %d acquires, want 1", b.Calls("acquire"))
		}
	})
	t.Run("no HOME", func(t *testing.T) {
		te := newTestEnv(map[string]string{})
		if code := te.run("status"); code != exitUsage || !strings.Contains(te.stderr.String(), "HOME") {
			t.Fatalf("exit %d, stderr %q; want 64 naming HOME", code, te.stderr.String())
		}
	})
}

func TestSQLiteURLPaths(t *testing.T) {
	for _, dir := range []string{"plain", "with space", "hash#and?query", "percent%41", "ünï"} {
		path := filepath.Join(t.TempDir(), dir, "locks.db")
		u := sqliteURL(path)
		if strings.ContainsAny(u, " #?") {
			t.Errorf("%q: URL %q not escaped", path, u)
		}
		te := newTestEnv(nil)
		if code := te.run("run", "--url", u, "x", "--", "true"); code != 0 {
			t.Fatalf("%q: exit %d: %s", u, code, te.stderr.String())
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("URL %q did not open %q: %v", u, path, err)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	mem, _ := memURL()
	for _, tc := range []struct {
		cmd  []string
		want int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 3"}, 3},
		{[]string{"sh", "-c", "exit 255"}, 255},
		{[]string{"sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM)},
		{[]string{"sh", "-c", "kill -KILL $$"}, 128 + int(syscall.SIGKILL)},
		{[]string{"/nonexistent/program"}, exitNotFound},
		{[]string{"no-such-program-dlock-test"}, exitNotFound},
		{[]string{os.TempDir()}, exitCannotExec}, // a directory
	} {
		te := newTestEnv(nil)
		args := append([]string{"run", "--url", mem, "codes", "--"}, tc.cmd...)
		if code := te.run(args...); code != tc.want {
			t.Errorf("%q: exit %d, want %d; stderr %q", tc.cmd, code, tc.want, te.stderr.String())
		}
	}
	// Every run released the lock, whatever the child did.
	holdLock(t, mem, "codes", nil)
}

func TestRunWithoutDash(t *testing.T) {
	mem, _ := memURL()
	te := newTestEnv(nil)
	if code := te.run("run", "--url", mem, "x", "echo", "hello"); code != 0 || te.stdout.String() != "hello\n" {
		t.Fatalf("exit %d, stdout %q; stderr %q", code, te.stdout.String(), te.stderr.String())
	}
}

func TestRunEnvironment(t *testing.T) {
	mem, _ := memURL()
	prev := holdLock(t, mem, "env/lock", nil)
	if err := prev.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Inherited values are replaced, not duplicated.
	te := newTestEnv(map[string]string{"DLOCK_TOKEN": "999", "DLOCK_NAME": "stale", "KEEP_ME": "yes"})
	code := te.run("run", "--url", mem, "env/lock", "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_TOKEN $KEEP_ME"; env | grep -c '^DLOCK_TOKEN='`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	want := "env/lock " + strconv.FormatUint(prev.Token()+1, 10) + " yes\n1\n"
	if got := te.stdout.String(); got != want {
		t.Fatalf("child saw %q, want %q", got, want)
	}
}

func TestRunHoldsTheLockWhileTheChildRuns(t *testing.T) {
	mem, b := memURL()
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	te := newTestEnv(nil)
	done := make(chan int, 1)
	go func() {
		done <- te.run("run", "--url", mem, "--owner", "cli-test-owner", "held", "--", "sh", "-c",
			`touch "$1"; while [ ! -e "$2" ]; do sleep 0.01; done`, "sh", started, release)
	}()
	waitFor(t, "child to start", 10*time.Second, fileExists(started))
	if owner, _ := b.Holder("held"); owner != "cli-test-owner" {
		t.Fatalf("holder while child runs is %q, want cli-test-owner", owner)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := recvExit(t, done); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	if owner, _ := b.Holder("held"); owner != "" {
		t.Fatalf("lock still held by %q after the child exited", owner)
	}
}

func TestRunNotAcquired(t *testing.T) {
	mem, _ := memURL()
	holdLock(t, mem, "busy", nil)
	marker := filepath.Join(t.TempDir(), "ran")
	child := []string{"--", "touch", marker}

	te := newTestEnv(nil)
	if code := te.run(append([]string{"run", "--url", mem, "--no-wait", "busy"}, child...)...); code != exitNotAcquired {
		t.Fatalf("--no-wait: exit %d, want %d; stderr %q", code, exitNotAcquired, te.stderr.String())
	}
	if !strings.Contains(te.stderr.String(), `"busy" is held`) {
		t.Errorf("--no-wait stderr %q does not say the lock is held", te.stderr.String())
	}

	te = newTestEnv(nil)
	if code := te.run(append([]string{"run", "--url", mem, "--wait", "0", "busy"}, child...)...); code != exitNotAcquired {
		t.Fatalf("--wait 0: exit %d, want %d", code, exitNotAcquired)
	}

	te = newTestEnv(nil)
	start := time.Now()
	if code := te.run(append([]string{"run", "--url", mem, "--wait", "300ms", "busy"}, child...)...); code != exitNotAcquired {
		t.Fatalf("--wait 300ms: exit %d, want %d; stderr %q", code, exitNotAcquired, te.stderr.String())
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Errorf("--wait 300ms gave up after %v", el)
	}
	if !strings.Contains(te.stderr.String(), "not acquired within 300ms") {
		t.Errorf("--wait stderr %q", te.stderr.String())
	}
	if fileExists(marker)() {
		t.Fatal("the child ran although the lock was not acquired")
	}
}

func TestRunWaitsForRelease(t *testing.T) {
	mem, b := memURL()
	held := holdLock(t, mem, "queue", nil)
	te := newTestEnv(nil)
	done := make(chan int, 1)
	go func() {
		done <- te.run("run", "--url", mem, "--wait", "1m", "queue", "--", "sh", "-c", "echo $DLOCK_TOKEN")
	}()
	// The test's own acquire, then run's first attempt.
	waitFor(t, "run to find the lock held", 10*time.Second, func() bool { return b.Calls("acquire") >= 2 })
	select {
	case code := <-done:
		t.Fatalf("run finished (exit %d) while the lock was held", code)
	default:
	}
	if err := held.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code := recvExit(t, done); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	tok, err := strconv.ParseUint(strings.TrimSpace(te.stdout.String()), 10, 64)
	if err != nil || tok <= held.Token() {
		t.Fatalf("child's token %q, want above the previous holder's %d", te.stdout.String(), held.Token())
	}
}

func TestRunSignalWhileWaiting(t *testing.T) {
	mem, b := memURL()
	holdLock(t, mem, "sigwait", nil)
	marker := filepath.Join(t.TempDir(), "ran")
	te := newTestEnv(nil)
	done := make(chan int, 1)
	go func() { done <- te.run("run", "--url", mem, "sigwait", "--", "touch", marker) }()
	waitFor(t, "run to wait (a second acquire attempt)", 10*time.Second, func() bool { return b.Calls("acquire") >= 2 })
	te.sigs <- syscall.SIGINT
	if code := recvExit(t, done); code != 128+int(syscall.SIGINT) {
		t.Fatalf("exit %d, want %d; stderr %q", code, 128+int(syscall.SIGINT), te.stderr.String())
	}
	if fileExists(marker)() {
		t.Fatal("the child ran after the wait was interrupted")
	}
}

func TestRunForwardsSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			mem, _ := memURL()
			dir := t.TempDir()
			ready, got := filepath.Join(dir, "ready"), filepath.Join(dir, "got")
			name := strings.TrimPrefix(sigName(sig), "SIG")
			script := `trap 'echo ` + name + ` >> "$2"; exit 7' ` + name + `; touch "$1"; while :; do sleep 0.01; done`
			te := newTestEnv(nil)
			done := make(chan int, 1)
			go func() { done <- te.run("run", "--url", mem, "fwd", "--", "sh", "-c", script, "sh", ready, got) }()
			waitFor(t, "child to start", 10*time.Second, fileExists(ready))
			te.sigs <- sig
			if code := recvExit(t, done); code != 7 {
				t.Fatalf("exit %d, want the child's 7; stderr %q", code, te.stderr.String())
			}
			// Delivered once: the trap ran once.
			if s := readFile(t, got); s != name {
				t.Fatalf("child's trap log %q, want one %s", s, name)
			}
		})
	}
}

func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
}

func TestRunLeaseLost(t *testing.T) {
	t.Run("child stops on SIGTERM", func(t *testing.T) {
		mem, b := memURL()
		dir := t.TempDir()
		ready, got := filepath.Join(dir, "ready"), filepath.Join(dir, "got")
		te := newTestEnv(nil)
		done := make(chan int, 1)
		go func() {
			done <- te.run("run", "--url", mem, "--ttl", "300ms", "lost", "--", "sh", "-c",
				`trap 'echo TERM > "$2"; exit 0' TERM; touch "$1"; while :; do sleep 0.01; done`, "sh", ready, got)
		}()
		waitFor(t, "child to start", 10*time.Second, fileExists(ready))
		if !b.Drop("lost") {
			t.Fatal("lock not held while the child ran")
		}
		start := time.Now()
		if code := recvExit(t, done); code != exitLeaseLost {
			t.Fatalf("exit %d, want %d; stderr %q", code, exitLeaseLost, te.stderr.String())
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("loss handled after %v, want about one renewal interval", el)
		}
		if s := readFile(t, got); s != "TERM" {
			t.Fatalf("child got %q, want TERM", s)
		}
		if !strings.Contains(te.stderr.String(), "lease lost") {
			t.Errorf("stderr %q does not report the loss", te.stderr.String())
		}
	})
	t.Run("child ignoring SIGTERM is killed after the grace", func(t *testing.T) {
		mem, b := memURL()
		dir := t.TempDir()
		ready := filepath.Join(dir, "ready")
		te := newTestEnv(nil)
		done := make(chan int, 1)
		go func() {
			done <- te.run("run", "--url", mem, "--ttl", "300ms", "--kill-grace", "400ms", "lost", "--", "sh", "-c",
				`trap '' TERM; touch "$1"; while :; do sleep 0.01; done`, "sh", ready)
		}()
		waitFor(t, "child to start", 10*time.Second, fileExists(ready))
		b.Drop("lost")
		start := time.Now()
		if code := recvExit(t, done); code != exitLeaseLost {
			t.Fatalf("exit %d, want %d; stderr %q", code, exitLeaseLost, te.stderr.String())
		}
		if el := time.Since(start); el < 400*time.Millisecond {
			t.Errorf("child gone %v after the loss, before the 400ms grace", el)
		}
		if !strings.Contains(te.stderr.String(), "SIGKILL") {
			t.Errorf("stderr %q does not report the SIGKILL", te.stderr.String())
		}
	})
	t.Run("kill-grace 0 kills at once", func(t *testing.T) {
		mem, b := memURL()
		ready := filepath.Join(t.TempDir(), "ready")
		te := newTestEnv(nil)
		done := make(chan int, 1)
		go func() {
			done <- te.run("run", "--url", mem, "--ttl", "300ms", "--kill-grace", "0", "lost", "--", "sh", "-c",
				`trap '' TERM; touch "$1"; while :; do sleep 0.01; done`, "sh", ready)
		}()
		waitFor(t, "child to start", 10*time.Second, fileExists(ready))
		b.Drop("lost")
		if code := recvExit(t, done); code != exitLeaseLost {
			t.Fatalf("exit %d, want %d; stderr %q", code, exitLeaseLost, te.stderr.String())
		}
	})
}

func TestStatus(t *testing.T) {
	mem, _ := memURL()
	holdLock(t, mem, "jobs/a", &dlock.MutexOptions{Owner: "owner-0123456789abcdef", TTL: time.Minute})
	free := holdLock(t, mem, "jobs/b", nil)
	if err := free.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	holdLock(t, mem, "other", nil)

	te := newTestEnv(nil)
	if code := te.run("status", "--url", mem, "jobs/"); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	lines := strings.Split(strings.TrimRight(te.stdout.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("table:\n%s\nwant a header and two rows", te.stdout.String())
	}
	if f := strings.Fields(lines[0]); !reflect.DeepEqual(f, []string{"NAME", "TYPE", "HOLDER", "TOKEN", "EXPIRES-IN", "WAITERS"}) {
		t.Fatalf("header %q", lines[0])
	}
	a := strings.Fields(lines[1])
	if len(a) != 6 || a[0] != "jobs/a" || a[1] != "mutex" || a[2] != "owner-012345" || a[3] != "1" || a[5] != "0" {
		t.Fatalf("row %q, want jobs/a mutex owner-012345 1 <expiry> 0", lines[1])
	}
	if d, err := time.ParseDuration(a[4]); err != nil || d <= 50*time.Second || d > time.Minute {
		t.Fatalf("expires-in %q, want just under 1m", a[4])
	}
	if b := strings.Fields(lines[2]); !reflect.DeepEqual(b, []string{"jobs/b", "mutex", "-", "1", "-", "0"}) {
		t.Fatalf("free row %q", lines[2])
	}

	te = newTestEnv(nil)
	if code := te.run("status", "--url", mem, "--json"); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(te.stdout.String()), &rows); err != nil {
		t.Fatalf("--json output %q: %v", te.stdout.String(), err)
	}
	if len(rows) != 3 {
		t.Fatalf("--json listed %d locks, want 3: %s", len(rows), te.stdout.String())
	}
	for _, r := range rows {
		var keys []string
		for k := range r {
			keys = append(keys, k)
		}
		if len(keys) != 10 {
			t.Fatalf("row %v: keys %v, want name type owner token count expires_in_ms waiters readers holders permits", r, keys)
		}
	}
	if r := rows[0]; r["name"] != "jobs/a" || r["owner"] != "owner-0123456789abcdef" || r["token"] != 1.0 || r["count"] != 1.0 {
		t.Fatalf("held row %v", r)
	}
	if ms, ok := rows[0]["expires_in_ms"].(float64); !ok || ms <= 50000 || ms > 60000 {
		t.Fatalf("held row expires_in_ms %v", rows[0]["expires_in_ms"])
	}
	if r := rows[1]; r["name"] != "jobs/b" || r["owner"] != "" || r["count"] != 0.0 || r["expires_in_ms"] != 0.0 || r["waiters"] != 0.0 {
		t.Fatalf("free row %v", r)
	}

	te = newTestEnv(nil)
	if code := te.run("status", "--url", mem, "--json", "nothing-here/"); code != 0 || strings.TrimSpace(te.stdout.String()) != "[]" {
		t.Fatalf("empty --json: exit %d, output %q", code, te.stdout.String())
	}
}

func TestStatusSQLite(t *testing.T) {
	u, _ := sqliteTestURL(t)
	for range 2 {
		if code := newTestEnv(nil).run("run", "--url", u, "nightly", "--", "true"); code != 0 {
			t.Fatalf("run exit %d", code)
		}
	}
	holdLock(t, u, "held", &dlock.MutexOptions{Owner: "abcdefghijklmnopqrstuvwxyz"})
	te := newTestEnv(nil)
	if code := te.run("status", "--url", u, "--json"); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	var rows []lockJSON
	if err := json.Unmarshal([]byte(te.stdout.String()), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Name != "held" || rows[0].Owner != "abcdefghijklmnopqrstuvwxyz" || rows[0].ExpiresInMS == nil ||
		rows[1].Name != "nightly" || rows[1].Token != 2 || rows[1].Owner != "" || rows[1].Waiters != nil {
		t.Fatalf("status --json: %s", te.stdout.String())
	}
	te = newTestEnv(nil)
	if code := te.run("status", "--url", u); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	if !strings.Contains(te.stdout.String(), "abcdefghijkl ") || strings.Contains(te.stdout.String(), "abcdefghijklm") {
		t.Fatalf("holder not shortened to 12 characters:\n%s", te.stdout.String())
	}
}

func TestStatusUnsupported(t *testing.T) {
	te := newTestEnv(nil)
	if code := te.run("status", "--url", "test-noinspect://x"); code != exitUnavailable {
		t.Fatalf("exit %d, want %d", code, exitUnavailable)
	}
	if !strings.Contains(te.stderr.String(), "cannot list") {
		t.Fatalf("stderr %q", te.stderr.String())
	}
}

func TestCredentialsNeverPrinted(t *testing.T) {
	const secret = "hunter2-s3cret"
	for _, args := range [][]string{
		{"run", "--url", "test-leaky://alice:" + secret + "@db.example/x", "x", "--", "true"},
		{"status", "--url", "test-leaky://alice:" + secret + "@db.example/x"},
		{"run", "--url", "nosuch://alice:" + secret + "@db.example/x", "x", "--", "true"},
		{"status", "--url", "sqlite://alice:" + secret + "@/tmp/x.db"},
		{"status", "--url", "redis://alice:" + secret + "@127.0.0.1:1/%zz"},
		// Some drivers take passwords as query parameters.
		{"status", "--url", "test-leaky://db.example/x?sslmode=off&password=" + secret},
		{"status", "--url", "test-leaky://db.example/x?auth_token=" + strings.ReplaceAll(secret, "-", "%2D")},
	} {
		te := newTestEnv(nil)
		code := te.run(args...)
		if code == 0 {
			t.Errorf("%q: exit 0, want an error", args)
		}
		if out := te.stdout.String() + te.stderr.String(); strings.Contains(out, "s3cret") || !strings.HasPrefix(out, "dlock: ") {
			t.Errorf("%q: output %q shows the password (or is not a dlock: message)", args, out)
		}
	}
	// The same through $DLOCK_URL.
	te := newTestEnv(map[string]string{"DLOCK_URL": "test-leaky://alice:" + secret + "@db.example/x"})
	if code := te.run("status"); code != exitUnavailable || strings.Contains(te.stderr.String(), secret) {
		t.Errorf("DLOCK_URL: exit %d, stderr %q", code, te.stderr.String())
	}
}

// Short secrets are secrets too: dlock masks them whatever their length (a
// "4 characters or more" rule printed "zq"), and api_key counts as a
// credential on the CLI as in the library.
func TestShortCredentialsNeverPrinted(t *testing.T) {
	for _, tc := range []struct{ url, secret string }{
		{"test-leaky://alice:zq@db.example/x", ":zq@"},
		{"test-leaky://db.example/x?password=zq", "=zq"},
		{"test-leaky://db.example/x?api_key=k9", "k9"},
		{"test-leaky://db.example/x?sslpassword=a%2Fb", "a/b"},
	} {
		te := newTestEnv(nil)
		if code := te.run("status", "--url", tc.url); code != exitUnavailable {
			t.Errorf("%s: exit %d, want %d", tc.url, code, exitUnavailable)
		}
		if out := te.stdout.String() + te.stderr.String(); strings.Contains(out, tc.secret) || !strings.Contains(out, "xxxxx") {
			t.Errorf("%s: output %q shows the secret %q", tc.url, out, tc.secret)
		}
	}
}

func TestRoundDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		456789 * time.Microsecond: "457ms",
		12345 * time.Millisecond:  "12.3s",
		754321 * time.Millisecond: "12m34s",
		0:                         "0s",
	} {
		if got := roundDuration(d); got != want {
			t.Errorf("roundDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// recvExit waits for an in-process run's exit code, with a deadline.
func recvExit(t *testing.T, done <-chan int) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(time.Minute):
		t.Fatal("dlock run did not return within a minute")
		return -1
	}
}

// TestCommandsShareNoState builds two command trees: a flag set on one must
// not show in the other (no package-level flag variables).
func TestCommandsShareNoState(t *testing.T) {
	mem, _ := memURL()
	holdLock(t, mem, "x", nil)
	var a, b syncBuffer
	for i, tc := range []struct {
		args []string
		out  *syncBuffer
	}{{[]string{"status", "--json", "--url", mem}, &a}, {[]string{"status", "--url", mem}, &b}} {
		root := newRootCmd(newTestEnv(nil).env())
		root.SetOut(tc.out)
		root.SetArgs(tc.args)
		if err := root.Execute(); err != nil {
			t.Fatalf("tree %d: %v", i, err)
		}
	}
	if !strings.HasPrefix(a.String(), "[") || !strings.HasPrefix(b.String(), "NAME") {
		t.Fatalf("first tree printed %q, second %q; want JSON then a table", a.String(), b.String())
	}
}
