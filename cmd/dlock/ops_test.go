package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// TestVersion: --version prints the build info line; a binary built from
// the checkout with VCS stamping names its revision and whether the tree was
// modified.
func TestVersion(t *testing.T) {
	te := newTestEnv(nil)
	if code := te.run("--version"); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	if out := te.stdout.String(); !strings.HasPrefix(out, "dlock ") || !strings.Contains(out, "go1.") {
		t.Errorf("--version printed %q", out)
	}

	bin := filepath.Join(t.TempDir(), "dlock")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("dlock --version: %v\n%s", err, out)
	}
	// The revision is a commit of this repository (others may have
	// committed since the build, so it need not be HEAD).
	m := regexp.MustCompile(`revision ([0-9a-f]{12})`).FindStringSubmatch(string(out))
	if m == nil && inWorktree(t) {
		// The go command stamps nothing in a linked worktree (its .git is
		// a file); CI builds from a clone.
		t.Skipf("--version printed %q: a linked git worktree, which go build does not stamp", out)
	}
	if m == nil {
		t.Fatalf("--version printed %q, want a revision", out)
	}
	if err := exec.Command("git", "cat-file", "-e", m[1]+"^{commit}").Run(); err != nil {
		t.Errorf("revision %s is not a commit of the checkout: %v", m[1], err)
	}
	dirty, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	if err != nil {
		t.Fatalf("git status: %v", err)
	}
	if got := strings.Contains(string(out), "modified"); got != (len(dirty) > 0) {
		t.Errorf("--version printed %q; modified shown %v, tree dirty %v", out, got, len(dirty) > 0)
	}
}

// TestCompletion: cobra's completion scripts for bash, zsh and fish.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_dlock", "zsh": "#compdef dlock", "fish": "complete -c dlock"} {
		te := newTestEnv(nil)
		if code := te.run("completion", shell); code != 0 {
			t.Fatalf("completion %s: exit %d: %s", shell, code, te.stderr.String())
		}
		if !strings.Contains(te.stdout.String(), want) {
			t.Errorf("completion %s lacks %q", shell, want)
		}
	}
}

// TestErrorsSayItOnce: library errors are printed without their nested
// "dlock: " prefixes.
func TestErrorsSayItOnce(t *testing.T) {
	err := &dlock.OpError{Op: "trylock", Name: "orders/42", Err: dlock.ErrLocked}
	if got, want := message(err), `dlock: trylock "orders/42": lock is held`; got != want {
		t.Errorf("message = %q, want %q", got, want)
	}
}

// TestRunLeaseLostMessage: a lost lease is reported in one line that says
// "lease lost" once, with its cause, and no nested "dlock: ".
func TestRunLeaseLostMessage(t *testing.T) {
	mem, b := memURL()
	ready := filepath.Join(t.TempDir(), "ready")
	te := newTestEnv(nil)
	done := make(chan int, 1)
	go func() {
		done <- te.run("run", "--url", mem, "--ttl", "300ms", "--kill-grace", "0", "stop", "--", "sh", "-c",
			`touch "$1"; while :; do sleep 0.01; done`, "sh", ready)
	}()
	waitFor(t, "child to start", 10*time.Second, fileExists(ready))
	b.Drop("stop")
	if code := recvExit(t, done); code != exitLeaseLost {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	line, _, _ := strings.Cut(te.stderr.String(), "\n")
	if strings.Count(line, "dlock: ") != 1 || strings.Count(line, "lost") != 1 || !strings.Contains(line, `lease lost on "stop": `) || !strings.Contains(line, "not held") {
		t.Errorf("loss reported as %q", line)
	}
}

// TestLogFormat: --log-format json turns every message into a JSON record,
// a bad format is refused, and -v reports the holder while run waits, again
// when it changes, and the grant and release.
func TestLogFormat(t *testing.T) {
	mem, _ := memURL()
	te := newTestEnv(nil)
	if code := te.run("--log-format", "yaml", "status", "--url", mem); code != exitUsage || !strings.Contains(te.stderr.String(), "--log-format must be text or json") {
		t.Errorf("bad --log-format: exit %d, %q", code, te.stderr.String())
	}

	holdLock(t, mem, "held", &dlock.MutexOptions{Owner: "someone-else", TTL: time.Minute})
	te = newTestEnv(nil)
	if code := te.run("run", "--log-format", "json", "--url", mem, "--no-wait", "held", "--", "true"); code != exitNotAcquired {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	recs := jsonRecords(t, te.stderr.String())
	if len(recs) != 1 || recs[0]["level"] != "ERROR" || !strings.HasPrefix(recs[0]["msg"].(string), `dlock: lock "held" is held`) {
		t.Errorf("records %v", recs)
	}

	// -v while waiting: a holder that changes is reported again.
	c := openClient(t, mem)
	first, err := c.NewMutex("w", &dlock.MutexOptions{Owner: "first-holder", TTL: time.Minute}).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	te = newTestEnv(nil)
	done := make(chan int, 1)
	go func() { done <- te.run("run", "-v", "--log-format", "json", "--url", mem, "w", "--", "true") }()
	waitFor(t, "the first holder reported", 20*time.Second, func() bool { return strings.Contains(te.stderr.String(), `"owner":"first-holder"`) })
	if err := first.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The waiting run may take it now, or the second holder first.
	second, err := c.NewMutex("w", &dlock.MutexOptions{Owner: "second-holder", TTL: time.Minute}).TryLock(context.Background())
	if err == nil {
		waitFor(t, "the second holder reported", 20*time.Second, func() bool { return strings.Contains(te.stderr.String(), `"owner":"second-holder"`) })
		if err := second.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if code := recvExit(t, done); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	var msgs []string
	for _, r := range jsonRecords(t, te.stderr.String()) {
		msgs = append(msgs, r["msg"].(string))
		if r["msg"] == "dlock: waiting" && r["name"] != "w" {
			t.Errorf("waiting record %v", r)
		}
	}
	if s := strings.Join(msgs, "|"); !strings.Contains(s, "dlock: waiting") || !strings.HasSuffix(s, "dlock: acquired|dlock: released") {
		t.Errorf("records %q", s)
	}

	// Text: the same as "dlock: ..." lines with key=value attributes.
	te = newTestEnv(nil)
	if code := te.run("run", "-v", "--url", mem, "free-one", "--", "true"); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	if !regexp.MustCompile(`(?m)^dlock: acquired name=free-one type=mutex token=\d+ owner=[\w-]+$`).MatchString(te.stderr.String()) {
		t.Errorf("text records %q", te.stderr.String())
	}
}

func jsonRecords(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON record: %q", line)
		}
		out = append(out, m)
	}
	return out
}

// TestConflictExitCode: --conflict-exit-code replaces 75 for run and wait;
// values a process cannot exit with are refused.
func TestConflictExitCode(t *testing.T) {
	mem, _ := memURL()
	holdLock(t, mem, "busy", nil)
	for _, args := range [][]string{
		{"run", "--url", mem, "--no-wait", "--conflict-exit-code", "3", "busy", "--", "true"},
		{"run", "--url", mem, "--wait", "200ms", "--conflict-exit-code", "3", "busy", "--", "true"},
		{"wait", "--url", mem, "--wait", "0", "--conflict-exit-code", "3", "busy"},
		{"wait", "--url", mem, "--wait", "300ms", "--conflict-exit-code", "3", "busy"},
	} {
		te := newTestEnv(nil)
		if code := te.run(args...); code != 3 {
			t.Errorf("%q: exit %d, want 3; %s", args, code, te.stderr.String())
		}
	}
	for _, args := range [][]string{
		{"run", "--url", mem, "--conflict-exit-code", "256", "x", "--", "true"},
		{"wait", "--url", mem, "--conflict-exit-code", "-1", "x"},
	} {
		te := newTestEnv(nil)
		if code := te.run(args...); code != exitUsage {
			t.Errorf("%q: exit %d, want 64", args, code)
		}
	}
}

// TestRunTTLVariable: CMD gets DLOCK_TTL in seconds, from --ttl or the URL.
func TestRunTTLVariable(t *testing.T) {
	mem, _ := memURL()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", mem}, "30"},
		{[]string{"--url", mem, "--ttl", "1m30s"}, "90"},
		{[]string{"--url", mem + "?ttl=2.5s"}, "2.5"},
	} {
		te := newTestEnv(map[string]string{"DLOCK_TTL": "stale"})
		args := append(append([]string{"run"}, tc.args...), "ttl", "--", "sh", "-c", `echo "$DLOCK_TTL"; env | grep -c '^DLOCK_TTL='`)
		if code := te.run(args...); code != 0 {
			t.Fatalf("exit %d: %s", code, te.stderr.String())
		}
		if got := te.stdout.String(); got != tc.want+"\n1\n" {
			t.Errorf("%q: CMD saw DLOCK_TTL %q, want %s", tc.args, got, tc.want)
		}
	}
}

// TestWait: wait returns at once for a free or unknown lock, blocks while
// the lock is held and returns once it is released, without ever taking it
// (the token does not move), and gives up with 75 after --wait.
func TestWait(t *testing.T) {
	u, _ := sqliteTestURL(t)
	te := newTestEnv(nil)
	if code := te.run("wait", "--url", u, "never-taken"); code != 0 {
		t.Fatalf("wait on an unknown lock: exit %d: %s", code, te.stderr.String())
	}
	l := holdLock(t, u, "job", nil)
	te = newTestEnv(nil)
	start := time.Now()
	if code := te.run("wait", "--url", u, "--wait", "500ms", "job"); code != exitNotAcquired {
		t.Fatalf("wait on a held lock: exit %d: %s", code, te.stderr.String())
	}
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Errorf("gave up after %v, before --wait 500ms", el)
	}
	if s := te.stderr.String(); !strings.Contains(s, `lock "job" still held after 500ms (by `) || !strings.Contains(s, "token "+itoa(l.Token())) {
		t.Errorf("message %q", s)
	}

	te = newTestEnv(nil)
	done := make(chan int, 1)
	go func() { done <- te.run("wait", "-v", "--url", u, "job") }()
	waitFor(t, "wait to report the holder", 20*time.Second, func() bool { return strings.Contains(te.stderr.String(), "owner="+l.Owner()) })
	select {
	case code := <-done:
		t.Fatalf("wait returned %d while the lock was held", code)
	default:
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code := recvExit(t, done); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	// It did not take the lock: the next grant's token follows the holder's.
	l2 := holdLock(t, u, "job", nil)
	if l2.Token() != l.Token()+1 {
		t.Errorf("token after wait %d, want %d: wait took the lock", l2.Token(), l.Token()+1)
	}

	// A signal ends the wait with 128+N.
	te = newTestEnv(nil)
	go func() { done <- te.run("wait", "--url", u, "job") }()
	waitFor(t, "wait to start", 20*time.Second, func() bool { return te.notified.Load() > 0 })
	te.sigs <- syscall.SIGINT
	if code := recvExit(t, done); code != 128+int(syscall.SIGINT) {
		t.Errorf("wait after SIGINT: exit %d", code)
	}
	// Bad input and a backend that cannot list.
	for _, args := range [][]string{{"wait", "--url", u}, {"wait", "--url", u, "--type", "queue", "x"}, {"wait", "--url", u, "--wait", "-1s", "x"}} {
		if code := newTestEnv(nil).run(args...); code != exitUsage {
			t.Errorf("%q: exit %d, want 64", args, code)
		}
	}
	if code := newTestEnv(nil).run("wait", "--url", "test-noinspect://w", "x"); code != exitUnavailable {
		t.Errorf("wait on a backend without Inspect: exit %d, want 69", code)
	}
}

// TestWaitKinds: --type picks the read/write lock or the semaphore.
func TestWaitKinds(t *testing.T) {
	u, _ := sqliteTestURL(t)
	c := openClient(t, u)
	r, err := c.NewRWMutex("k", nil).TryRLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if code := newTestEnv(nil).run("wait", "--url", u, "--wait", "0", "k"); code != 0 {
		t.Errorf("the mutex k is free, but wait exited %d", code)
	}
	te := newTestEnv(nil)
	if code := te.run("wait", "--url", u, "--wait", "0", "--type", "rwlock", "k"); code != exitNotAcquired || !strings.Contains(te.stderr.String(), "by 1 readers") {
		t.Errorf("rwlock k with a reader: exit %d, %q", code, te.stderr.String())
	}
	if err := r.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code := newTestEnv(nil).run("wait", "--url", u, "--wait", "0", "--type", "rwlock", "k"); code != 0 {
		t.Errorf("rwlock k free: exit %d", code)
	}
}

// TestStatusWatch: --watch lists again every interval until a signal (exit
// 0); JSON gives one array per line, and a change shows in the next one.
func TestStatusWatch(t *testing.T) {
	u, _ := sqliteTestURL(t)
	l := holdLock(t, u, "watched", nil)
	te := newTestEnv(nil)
	done := make(chan int, 1)
	go func() { done <- te.run("status", "--url", u, "--json", "--watch=100ms") }()
	lines := func() []string { return strings.Split(strings.TrimSpace(te.stdout.String()), "\n") }
	waitFor(t, "two listings", 20*time.Second, func() bool { return len(lines()) >= 2 })
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a listing showing the release", 20*time.Second, func() bool {
		ls := lines()
		return strings.Contains(ls[len(ls)-1], `"owner":""`)
	})
	te.sigs <- syscall.SIGTERM
	if code := recvExit(t, done); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	for _, line := range lines() {
		var v []lockJSON
		if err := json.Unmarshal([]byte(line), &v); err != nil || len(v) != 1 || v[0].Name != "watched" {
			t.Errorf("listing %q: %v", line, err)
		}
	}
	// A table per listing, with a time stamp, when stdout is not a terminal.
	te = newTestEnv(nil)
	go func() { done <- te.run("status", "--url", u, "--watch=100ms") }()
	waitFor(t, "two tables", 20*time.Second, func() bool { return strings.Count(te.stdout.String(), "NAME") >= 2 })
	te.sigs <- syscall.SIGINT
	if code := recvExit(t, done); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if code := newTestEnv(nil).run("status", "--url", u, "--watch=1ms"); code != exitUsage {
		t.Errorf("--watch=1ms: exit %d, want 64", code)
	}
}

// silentListener accepts TCP connections and never answers: a server that
// is up but stuck, which only a timeout gets past.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// TestConnectTimeout: --connect-timeout bounds opening every network
// backend against a server that accepts connections and never answers,
// well below the drivers' defaults (etcd 5s, ZooKeeper 10s), with exit 69
// and a message naming the flag.
func TestConnectTimeout(t *testing.T) {
	addr := silentListener(t)
	for _, raw := range []string{
		"etcd://" + addr,
		"zk://" + addr,
		"redis://" + addr,
		"postgres://u@" + addr + "/db?sslmode=disable",
		"mysql://u@" + addr + "/db",
	} {
		t.Run(strings.SplitN(raw, ":", 2)[0], func(t *testing.T) {
			te := newTestEnv(nil)
			start := time.Now()
			code := te.run("status", "--url", raw, "--connect-timeout", "700ms")
			el := time.Since(start)
			if code != exitUnavailable {
				t.Errorf("exit %d, want 69: %s", code, te.stderr.String())
			}
			if el > 4*time.Second {
				t.Errorf("gave up after %v with --connect-timeout 700ms", el)
			}
			if !strings.Contains(te.stderr.String(), "700ms") {
				t.Errorf("message %q does not name the timeout", te.stderr.String())
			}
		})
	}
	if code := newTestEnv(nil).run("status", "--url", "mem://x", "--connect-timeout", "-1s"); code != exitUsage {
		t.Errorf("negative --connect-timeout: exit %d", code)
	}
}

// TestWithConnectTimeout: the driver parameter is added in the form each
// driver reads, and never replaces the URL's own.
func TestWithConnectTimeout(t *testing.T) {
	for raw, want := range map[string]string{
		"etcd://h:2379/p":                        "etcd://h:2379/p?dial_timeout=1.5s",
		"zk://h:2181/r?acl=x":                    "zk://h:2181/r?acl=x&connect_timeout=1.5s",
		"redis://h:6379/0":                       "redis://h:6379/0?dial_timeout=1.5s",
		"redis-sentinel://s1,s2/0?master_name=m": "redis-sentinel://s1,s2/0?master_name=m&dial_timeout=1.5s",
		"postgres://u@h/db":                      "postgres://u@h/db?connect_timeout=2",
		"etcd://h:2379/p?dial_timeout=9s":        "etcd://h:2379/p?dial_timeout=9s",
		"sqlite:///tmp/x.db":                     "sqlite:///tmp/x.db",
		"mysql://u@tcp(h:3306)/db?parseTime=1":   "mysql://u@tcp(h:3306)/db?parseTime=1",
	} {
		if got := withConnectTimeout(raw, 1500*time.Millisecond); got != want {
			t.Errorf("withConnectTimeout(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestReleaseForce: release --force frees only the grant with the given
// token, refuses a wrong token or a free lock (exit 1, lock untouched), and
// the holder finds its lease gone.
func TestReleaseForce(t *testing.T) {
	u, _ := sqliteTestURL(t)
	c := openClient(t, u)
	l, err := c.NewMutex("stuck", &dlock.MutexOptions{TTL: time.Minute}).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	te := newTestEnv(nil)
	if code := te.run("release", "--url", u, "stuck", "--token", itoa(l.Token())); code != exitUsage || !strings.Contains(te.stderr.String(), "--force") {
		t.Errorf("without --force: exit %d, %q", code, te.stderr.String())
	}
	te = newTestEnv(nil)
	if code := te.run("release", "--force", "--url", u, "stuck"); code != exitUsage || !strings.Contains(te.stderr.String(), "--token") {
		t.Errorf("without --token: exit %d, %q", code, te.stderr.String())
	}
	te = newTestEnv(nil)
	if code := te.run("release", "--force", "--url", u, "stuck", "--token", itoa(l.Token()+1)); code != exitNothingReleased ||
		!strings.Contains(te.stderr.String(), "held with token "+itoa(l.Token())+", not "+itoa(l.Token()+1)+"; nothing released") {
		t.Errorf("wrong token: exit %d, %q", code, te.stderr.String())
	}
	if l.ValidFor() <= 0 {
		t.Fatal("lease gone after a refused release")
	}
	te = newTestEnv(nil)
	if code := te.run("release", "--force", "--url", u, "stuck", "--token", itoa(l.Token())); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	if out := te.stdout.String(); !strings.Contains(out, `released lock "stuck" (mutex, token `+itoa(l.Token())+", owner "+l.Owner()+", 1 hold)") {
		t.Errorf("stdout %q", out)
	}
	// The lock is free for others at once; the holder learns at its next renewal.
	l2, err := openClient(t, u).NewMutex("stuck", nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("lock not free after release --force: %v", err)
	}
	if err := l.Extend(context.Background(), time.Minute); !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("old holder's Extend: %v, want not held", err)
	}
	// Releasing the old token again never frees the newer holder.
	te = newTestEnv(nil)
	if code := te.run("release", "--force", "--url", u, "stuck", "--token", itoa(l.Token())); code != exitNothingReleased {
		t.Errorf("second release of the old token: exit %d", code)
	}
	if l2.ValidFor() <= 0 {
		t.Error("newer holder lost its lease")
	}
	if err := l2.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	te = newTestEnv(nil)
	if code := te.run("release", "--force", "--url", u, "stuck", "--token", itoa(l2.Token())); code != exitNothingReleased || !strings.Contains(te.stderr.String(), "is free") {
		t.Errorf("free lock: exit %d, %q", code, te.stderr.String())
	}
}

// TestReleaseForceReentered: a grant re-entered by its owner has all its
// holds given up.
func TestReleaseForceReentered(t *testing.T) {
	u, _ := sqliteTestURL(t)
	c := openClient(t, u)
	var token uint64
	for range 3 {
		l, err := c.NewMutex("re", &dlock.MutexOptions{Owner: "batch-7", TTL: time.Minute}).TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		token = l.Token()
	}
	te := newTestEnv(nil)
	if code := te.run("release", "--force", "--url", u, "re", "--token", itoa(token)); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	if !strings.Contains(te.stdout.String(), "3 holds") {
		t.Errorf("stdout %q", te.stdout.String())
	}
}

// TestServeInTree: "dlock serve" is a command of the tree.
func TestServeInTree(t *testing.T) {
	te := newTestEnv(nil)
	if code := te.run("serve", "--help"); code != 0 || !strings.Contains(te.stdout.String(), "/metrics") {
		t.Errorf("serve --help: exit %d", code)
	}
}

// inWorktree reports whether the checkout is a linked git worktree.
func inWorktree(t *testing.T) bool {
	t.Helper()
	dir, err := exec.Command("git", "rev-parse", "--git-dir").Output()
	if err != nil {
		return false
	}
	common, err := exec.Command("git", "rev-parse", "--git-common-dir").Output()
	if err != nil {
		return false
	}
	abs := func(b []byte) string {
		p, _ := filepath.Abs(strings.TrimSpace(string(b)))
		return p
	}
	return abs(dir) != abs(common)
}
