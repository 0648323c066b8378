package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

func TestRunKindFlagsUsage(t *testing.T) {
	mem, _ := memURL()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shared", "--permits", "2"}, "--permits cannot be used with --shared"},
		{[]string{"--exclusive", "--permits", "2"}, "--permits cannot be used with --shared or --exclusive"},
		{[]string{"--shared", "--exclusive"}, "--shared and --exclusive cannot be used together"},
		{[]string{"--permits", "0"}, "--permits must be at least 1"},
		{[]string{"--permits", "-3"}, "--permits must be at least 1"},
		{[]string{"--permits", "two"}, "--permits"},
	} {
		te := newTestEnv(nil)
		args := append(append([]string{"run", "--url", mem}, tc.args...), "x", "--", "true")
		if code := te.run(args...); code != exitUsage || !strings.Contains(te.stderr.String(), tc.want) {
			t.Errorf("dlock %q: exit %d, stderr %q; want %d mentioning %q", args, code, te.stderr.String(), exitUsage, tc.want)
		}
	}
	// A backend without read/write locks or semaphores refuses the flags.
	for _, flag := range [][]string{{"--shared"}, {"--exclusive"}, {"--permits", "2"}} {
		te := newTestEnv(nil)
		args := append(append([]string{"run", "--url", "test-noinspect://kinds"}, flag...), "x", "--", "true")
		if code := te.run(args...); code != exitUsage || !strings.Contains(te.stderr.String(), "this backend") {
			t.Errorf("dlock %q on a backend without kinds: exit %d, stderr %q; want %d saying the backend lacks them", args, code, te.stderr.String(), exitUsage)
		}
	}
}

func TestRunSharedAndPermits(t *testing.T) {
	mem, _ := memURL()
	c := openClient(t, mem)
	ctx := context.Background()
	run := func(args ...string) (int, string) {
		te := newTestEnv(nil)
		code := te.run(append(append([]string{"run", "--url", mem, "--no-wait"}, args...), "--", "true")...)
		return code, te.stderr.String()
	}
	// Readers share; a writer is refused while they hold.
	r, err := c.NewRWMutex("cfg", nil).TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, stderr := run("--shared", "cfg"); code != 0 {
		t.Fatalf("--shared beside a reader: exit %d, %s", code, stderr)
	}
	if code, stderr := run("--exclusive", "cfg"); code != exitNotAcquired || !strings.Contains(stderr, `read/write lock "cfg" is held`) {
		t.Fatalf("--exclusive beside a reader: exit %d, %s", code, stderr)
	}
	// The mutex of the same name is another lock.
	if code, stderr := run("cfg"); code != 0 {
		t.Fatalf("plain run beside a reader of the read/write lock: exit %d, %s", code, stderr)
	}
	_ = r.Unlock(ctx)
	w, err := c.NewRWMutex("cfg", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, stderr := run("--shared", "cfg"); code != exitNotAcquired || !strings.Contains(stderr, "held or awaited by a writer") {
		t.Fatalf("--shared beside a writer: exit %d, %s", code, stderr)
	}
	_ = w.Unlock(ctx)

	// Semaphores: a free permit is taken, a full semaphore refused, another
	// count refused as bad input.
	p1, err := c.NewSemaphore("enc", 2, nil).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, stderr := run("--permits", "2", "enc"); code != 0 {
		t.Fatalf("--permits 2 with 1 of 2 taken: exit %d, %s", code, stderr)
	}
	if code, stderr := run("--permits", "3", "enc"); code != exitUsage || !strings.Contains(stderr, "2 permits") {
		t.Fatalf("--permits 3 on a 2-permit semaphore in use: exit %d, %s", code, stderr)
	}
	p2, err := c.NewSemaphore("enc", 2, nil).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, stderr := run("--permits", "2", "enc"); code != exitNotAcquired || !strings.Contains(stderr, `all 2 permits of semaphore "enc" are taken`) {
		t.Fatalf("--permits 2 with 2 of 2 taken: exit %d, %s", code, stderr)
	}
	_, _ = p1.Unlock(ctx), p2.Unlock(ctx)
}

func TestStatusKinds(t *testing.T) {
	mem, _ := memURL()
	c := openClient(t, mem)
	ctx := context.Background()
	for range 2 {
		if _, err := c.NewRWMutex("k/rw", nil).TryRLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := c.NewRWMutex("k/w", &dlock.MutexOptions{Owner: "writer-0123456789"}).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.NewSemaphore("k/sem", 5, nil).TryAcquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	holdLock(t, mem, "k/m", nil)

	te := newTestEnv(nil)
	if code := te.run("status", "--url", mem, "k/"); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	lines := strings.Split(strings.TrimRight(te.stdout.String(), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("table:\n%s\nwant a header and 4 rows", te.stdout.String())
	}
	if f := strings.Fields(lines[0]); !reflect.DeepEqual(f, []string{"NAME", "TYPE", "HOLDER", "TOKEN", "EXPIRES-IN", "WAITERS"}) {
		t.Fatalf("header %q", lines[0])
	}
	want := [][]string{
		{"k/m", "mutex"},
		{"k/rw", "rwlock", "2", "readers", "2"},
		{"k/sem", "semaphore/5", "2", "of", "5", "2"},
		{"k/w", "rwlock", "writer-01234", fmt.Sprint(w.Token())},
	}
	for i, row := range want {
		if f := strings.Fields(lines[i+1]); len(f) < len(row) || !reflect.DeepEqual(f[:len(row)], row) {
			t.Fatalf("row %q, want it to begin %q", lines[i+1], row)
		}
	}

	te = newTestEnv(nil)
	if code := te.run("status", "--url", mem, "--json", "k/"); code != 0 {
		t.Fatalf("exit %d: %s", code, te.stderr.String())
	}
	var rows []lockJSON
	if err := json.Unmarshal([]byte(te.stdout.String()), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("--json: %s", te.stdout.String())
	}
	if r := rows[1]; r.Type != "rwlock" || r.Readers != 2 || r.Owner != "" || r.Count != 2 || r.ExpiresInMS == nil || *r.ExpiresInMS <= 0 {
		t.Fatalf("rwlock row %+v", r)
	}
	if r := rows[2]; r.Type != "semaphore" || r.Holders != 2 || r.Permits != 5 || r.ExpiresInMS == nil || *r.ExpiresInMS <= 0 {
		t.Fatalf("semaphore row %+v", r)
	}
	if r := rows[3]; r.Type != "rwlock" || r.Owner != "writer-0123456789" || r.Readers != 0 {
		t.Fatalf("write-held row %+v", r)
	}
	if r := rows[0]; r.Type != "mutex" {
		t.Fatalf("mutex row %+v", r)
	}
}

// span is one child's time inside the lock, read from a shared log.
type span struct {
	kind       string
	start, end int // line numbers in the log
}

// spans parses a log of "start KIND ID" and "end KIND ID" lines.
func spans(t *testing.T, log string) []span {
	t.Helper()
	open := map[string]*span{}
	var out []span
	for i, line := range strings.Split(readFile(t, log), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("log line %q", line)
		}
		switch f[0] {
		case "start":
			open[f[2]] = &span{kind: f[1], start: i, end: -1}
		case "end":
			s := open[f[2]]
			if s == nil {
				t.Fatalf("log: end before start for %s", f[2])
			}
			s.end = i
			out = append(out, *s)
		}
	}
	return out
}

// maxOverlap returns the most spans of kinds in ks inside at once, and
// whether an "exclusive" span ever overlapped another.
func maxOverlap(ss []span) (most int, exclusiveShared bool) {
	for _, a := range ss {
		n := 0
		for _, b := range ss {
			if b.start <= a.start && a.start < b.end {
				n++
				if a != b && (a.kind == "exclusive" || b.kind == "exclusive") {
					exclusiveShared = true
				}
			}
		}
		most = max(most, n)
	}
	return most, exclusiveShared
}

// childScript logs its span around a pause; $1 is the log, $2 the kind.
const childScript = `echo "start $2 $$" >> "$1"; sleep 0.3; echo "end $2 $$" >> "$1"`

// TestProcessSemaphoreLimit: five dlock processes share a 2-permit
// semaphore on one SQLite file; no more than two children run at once, and
// two do overlap.
func TestProcessSemaphoreLimit(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	log := filepath.Join(t.TempDir(), "log")
	const n = 5
	var cmds []*exec.Cmd
	var outs []*syncBuffer
	for range n {
		cmd, out := startDlock(t, dbURL, "run", "--ttl", "10s", "--permits", "2", "enc", "--", "sh", "-c", childScript, "sh", log, "permit")
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	for i, cmd := range cmds {
		if code := waitExit(t, cmd, 2*time.Minute); code != 0 {
			t.Fatalf("dlock %d: exit %d: %s", i, code, outs[i])
		}
	}
	ss := spans(t, log)
	if len(ss) != n {
		t.Fatalf("%d runs logged, want %d", len(ss), n)
	}
	if most, _ := maxOverlap(ss); most != 2 {
		t.Fatalf("at most %d children ran at once under --permits 2, want exactly 2 (log:\n%s)", most, readFile(t, log))
	}
}

// TestProcessSharedExclusive: --shared runs overlap one another, and an
// --exclusive run overlaps none, across dlock processes on one SQLite file.
func TestProcessSharedExclusive(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	// Two readers that each wait (up to 20s) for the other to be inside:
	// they finish only if they held the shared lock at the same time.
	both := `echo "start shared $$" >> "$1"; touch "$2/$3"; i=0; until [ -e "$2/r1" ] && [ -e "$2/r2" ]; do i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.05; done; echo "end shared $$" >> "$1"`
	r1, o1 := startDlock(t, dbURL, "run", "--ttl", "10s", "--shared", "cfg", "--", "sh", "-c", both, "sh", log, dir, "r1")
	r2, o2 := startDlock(t, dbURL, "run", "--ttl", "10s", "--shared", "cfg", "--", "sh", "-c", both, "sh", log, dir, "r2")
	for i, c := range []*exec.Cmd{r1, r2} {
		if code := waitExit(t, c, 2*time.Minute); code != 0 {
			t.Fatalf("reader %d: exit %d (9: the readers never held the lock together): %s", i+1, code, []*syncBuffer{o1, o2}[i])
		}
	}
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	var outs []*syncBuffer
	for _, kind := range []string{"shared", "exclusive", "shared", "exclusive", "shared"} {
		cmd, out := startDlock(t, dbURL, "run", "--ttl", "10s", "--"+kind, "cfg", "--", "sh", "-c", childScript, "sh", log, kind)
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	for i, cmd := range cmds {
		if code := waitExit(t, cmd, 2*time.Minute); code != 0 {
			t.Fatalf("dlock %d: exit %d: %s", i, code, outs[i])
		}
	}
	ss := spans(t, log)
	if len(ss) != len(cmds) {
		t.Fatalf("%d runs logged, want %d", len(ss), len(cmds))
	}
	if _, bad := maxOverlap(ss); bad {
		t.Fatalf("an --exclusive run overlapped another run:\n%s", readFile(t, log))
	}
}
