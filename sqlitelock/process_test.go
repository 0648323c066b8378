package sqlitelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// helperEnv tells a re-executed test binary which helper role to play.
const helperEnv = "SQLITELOCK_TEST_HELPER"

// runHelpers starts n copies of the test binary in the given role and
// returns their combined output, failing the test if any exits non-zero.
func runHelpers(t *testing.T, n int, role string, env ...string) []string {
	t.Helper()
	cmds := make([]*exec.Cmd, n)
	outs := make([]*strings.Builder, n)
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v=false")
		cmd.Env = append(os.Environ(), append(env, helperEnv+"="+role, fmt.Sprintf("HELPER_ID=%d", i))...)
		outs[i] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	res := make([]string, n)
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper %d: %v\n%s", i, err, outs[i])
		}
		res[i] = outs[i].String()
	}
	if t.Failed() {
		t.FailNow()
	}
	return res
}

// TestMultiProcess runs several processes contending for one lock in one
// file. Inside the critical section each does an unprotected
// read-modify-write of a counter file, marks its presence with an O_EXCL
// file, and appends its token to a log. Mutual exclusion means no lost
// update, no overlap, and tokens in the log strictly increasing.
func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	const procs, iters = 4, 25
	runHelpers(t, procs, "contend", "HELPER_DIR="+dir, fmt.Sprintf("HELPER_ITERS=%d", iters))

	b, err := os.ReadFile(filepath.Join(dir, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(procs*iters) {
		t.Fatalf("counter = %s, want %d: updates were lost, so critical sections overlapped", got, procs*iters)
	}
	f, err := os.Open(filepath.Join(dir, "tokens"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last uint64
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		tok, err := strconv.ParseUint(strings.Fields(sc.Text())[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Fatalf("token %d logged after %d: tokens must strictly increase across processes", tok, last)
		}
		last = tok
		lines++
	}
	if lines != procs*iters {
		t.Fatalf("%d tokens logged, want %d", lines, procs*iters)
	}
}

// TestMultiProcessClients is TestMultiProcess through the dlock API: each
// process opens a sqlite:// URL and waits in Mutex.Lock, as users do.
func TestMultiProcessClients(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	const procs, iters = 4, 15
	runHelpers(t, procs, "client", "HELPER_DIR="+dir, fmt.Sprintf("HELPER_ITERS=%d", iters))
	b, err := os.ReadFile(filepath.Join(dir, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(procs*iters) {
		t.Fatalf("counter = %s, want %d", got, procs*iters)
	}
	toks, err := os.ReadFile(filepath.Join(dir, "tokens"))
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for _, line := range strings.Split(strings.TrimSpace(string(toks)), "\n") {
		tok, err := strconv.ParseUint(strings.Fields(line)[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Fatalf("token %d logged after %d", tok, last)
		}
		last = tok
	}
}

// TestMultiProcessCrash: a process takes the lock and exits without
// releasing; another process gets it only after the TTL, with a greater
// token.
func TestMultiProcessCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	start := time.Now()
	out := runHelpers(t, 1, "crash", "HELPER_DIR="+dir)
	var tok uint64
	if _, err := fmt.Sscanf(lastLine(out[0]), "token %d", &tok); err != nil {
		t.Fatalf("helper output %q: %v", out[0], err)
	}
	d := openTest(t, filepath.Join(dir, "locks.db"), nil)
	g := pollAcquire(t, d, req("crash", "parent", time.Minute, 0), 10*time.Second)
	if el := time.Since(start); el < crashTTL {
		t.Fatalf("crashed holder's lock taken after %v, before its %v TTL", el, crashTTL)
	}
	if g.Token != tok+1 {
		t.Fatalf("token after crash %d, want %d", g.Token, tok+1)
	}
}

const crashTTL = 300 * time.Millisecond

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestHelperProcess is the body of the child processes; it does nothing
// in a normal test run.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(helperEnv)
	if role == "" {
		t.Skip("only runs as a child of the multi-process tests")
	}
	dir := os.Getenv("HELPER_DIR")
	id := os.Getenv("HELPER_ID")
	d, err := Open(filepath.Join(dir, "locks.db"), nil)
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	ctx := context.Background()
	switch role {
	case "crash":
		g, err := d.TryAcquire(ctx, req("crash", "child", crashTTL, 0))
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		fmt.Printf("token %d\n", g.Token)
		os.Exit(0) // no Release, no Close: a crash as far as the file knows
	case "client":
		d.Close()
		iters, _ := strconv.Atoi(os.Getenv("HELPER_ITERS"))
		if err := clientLoop(ctx, dir, id, iters); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	case "contend":
		iters, _ := strconv.Atoi(os.Getenv("HELPER_ITERS"))
		if err := contend(ctx, d, dir, id, iters); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		d.Close()
		os.Exit(0)
	}
	fmt.Println("unknown role", role)
	os.Exit(2)
}

func contend(ctx context.Context, d *Driver, dir, id string, iters int) error {
	for i := 0; i < iters; i++ {
		owner := fmt.Sprintf("p%s-%d", id, i)
		var g driver.Grant
		for {
			var err error
			g, err = d.TryAcquire(ctx, req("shared", owner, 30*time.Second, 0))
			if err == nil {
				break
			}
			var le *driver.LockedError
			if !errors.As(err, &le) {
				return err
			}
			time.Sleep(time.Duration(1+i%3) * time.Millisecond) // backoff between attempts
		}
		if err := critical(dir, id, g.Token); err != nil {
			return err
		}
		if n, err := d.Release(ctx, lease("shared", owner, g.Token, 30*time.Second, 0)); err != nil || n != 0 {
			return fmt.Errorf("release: %d, %v", n, err)
		}
	}
	return nil
}

func critical(dir, id string, token uint64) error {
	marker := filepath.Join(dir, "inside")
	m, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("overlap: another process is inside the critical section: %w", err)
	}
	m.Close()
	counter := filepath.Join(dir, "counter")
	n := 0
	if b, err := os.ReadFile(counter); err == nil {
		n, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if err := os.WriteFile(counter, []byte(strconv.Itoa(n+1)+"\n"), 0o644); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, "tokens"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "%d %s\n", token, id); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Remove(marker)
}

func clientLoop(ctx context.Context, dir, id string, iters int) error {
	c, err := dlock.Open(ctx, "sqlite://"+filepath.Join(dir, "locks.db")+"?ttl=10s")
	if err != nil {
		return err
	}
	defer c.Close()
	m := c.NewMutex("shared", nil)
	for i := 0; i < iters; i++ {
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		l, err := m.Lock(lctx)
		cancel()
		if err != nil {
			return err
		}
		if err := critical(dir, id, l.Token()); err != nil {
			return err
		}
		if err := l.Unlock(ctx); err != nil {
			return err
		}
	}
	return nil
}
