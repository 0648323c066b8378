package acceptance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// backend describes one URL to run the scenarios on.
type backend struct {
	url string
	ttl time.Duration // short TTL the backend handles reliably
	// sessionTTL: the backend grants its session's TTL (etcd, ZooKeeper,
	// pinned SQL connections), whatever the lock asks for.
	sessionTTL bool
	// freedOnDisconnect: the server ends the session as soon as the holder's
	// connection closes (SQL session modes), so a killed holder's lock is
	// free at once rather than after the TTL.
	freedOnDisconnect bool
}

func runScenarios(t *testing.T, b backend) {
	t.Run("MutualExclusionAcrossProcesses", func(t *testing.T) { mutualExclusion(t, b) })
	t.Run("PromptHandOff", func(t *testing.T) { handOff(t, b) })
	t.Run("KilledHolderExpires", func(t *testing.T) { killedHolder(t, b) })
	t.Run("PausedHolderLosesAndCannotUnlock", func(t *testing.T) { pausedHolder(t, b) })
	t.Run("CloseFreesAtOnce", func(t *testing.T) { closeFrees(t, b) })
	t.Run("BadInputRefused", func(t *testing.T) { badInput(t, b) })
}

func lockName(t *testing.T) string {
	return "acceptance/" + strings.ReplaceAll(t.Name(), "/", ".") + fmt.Sprintf("-%d", time.Now().UnixNano())
}

func mutualExclusion(t *testing.T, b backend) {
	const procs, rounds = 4, 8
	name := lockName(t)
	file := filepath.Join(t.TempDir(), "sections")
	ws := make([]*worker, procs)
	for i := range ws {
		ws[i] = startWorker(t, b.url)
	}
	for _, w := range ws {
		w.send(fmt.Sprintf("loop %s %d %s", name, rounds, file))
	}
	for _, w := range ws {
		w.expect("looped", 3*time.Minute)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2*procs*rounds {
		t.Fatalf("%d records, want %d", len(lines), 2*procs*rounds)
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		var tokS, tokE uint64
		var pidS, pidE int
		if _, err := fmt.Sscanf(lines[i], "start %d %d", &tokS, &pidS); err != nil {
			t.Fatalf("record %d = %q: sections overlapped", i, lines[i])
		}
		if _, err := fmt.Sscanf(lines[i+1], "end %d %d", &tokE, &pidE); err != nil || tokE != tokS || pidE != pidS {
			t.Fatalf("records %d-%d = %q, %q: two holders overlapped", i, i+1, lines[i], lines[i+1])
		}
		if tokS <= last {
			t.Fatalf("token %d after %d: not strictly increasing", tokS, last)
		}
		last = tokS
	}
}

func handOff(t *testing.T, b backend) {
	name := lockName(t)
	a, w := startWorker(t, b.url), startWorker(t, b.url)
	ta := token(t, a.do(fmt.Sprintf("lock %s %v", name, b.ttl), "locked", 30*time.Second))
	w.send(fmt.Sprintf("lock %s %v", name, b.ttl))
	// The waiter must stay blocked while the lock is held and renewed.
	select {
	case line := <-w.lines:
		t.Fatalf("waiter reported %q while the lock was held", line)
	case <-time.After(2 * b.ttl):
	}
	released := time.Now()
	a.do("unlock", "unlocked", 10*time.Second)
	tw := token(t, w.expect("locked", 10*b.ttl))
	took := time.Since(released)
	if took > b.ttl {
		t.Fatalf("hand-off took %v, longer than the TTL %v", took, b.ttl)
	}
	if tw <= ta {
		t.Fatalf("token %d after hand-off <= %d", tw, ta)
	}
	t.Logf("hand-off in %v", took.Round(time.Millisecond))
}

func killedHolder(t *testing.T, b backend) {
	name := lockName(t)
	a, w := startWorker(t, b.url), startWorker(t, b.url)
	ta := token(t, a.do(fmt.Sprintf("lock %s %v", name, b.ttl), "locked", 30*time.Second))
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if !b.freedOnDisconnect {
		w.do(fmt.Sprintf("trylock %s %v", name, b.ttl), "busy", 10*time.Second)
	}
	tw := token(t, w.do(fmt.Sprintf("lock %s %v", name, b.ttl), "locked", 20*b.ttl+30*time.Second))
	if tw <= ta {
		t.Fatalf("token %d after a killed holder <= %d", tw, ta)
	}
	t.Logf("freed %v after the holder was killed (TTL %v)", time.Since(killed).Round(time.Millisecond), b.ttl)
}

func pausedHolder(t *testing.T, b backend) {
	name := lockName(t)
	a, w, x := startWorker(t, b.url), startWorker(t, b.url), startWorker(t, b.url)
	ta := token(t, a.do(fmt.Sprintf("lock %s %v", name, b.ttl), "locked", 30*time.Second))
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	tw := token(t, w.do(fmt.Sprintf("lock %s %v", name, b.ttl), "locked", 20*b.ttl+30*time.Second))
	if tw <= ta {
		t.Fatalf("new holder's token %d <= paused holder's %d", tw, ta)
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The paused holder learns it lost the lease ...
	a.expect("lost", 10*b.ttl+10*time.Second)
	a.do("held", "notheld", 10*time.Second)
	// ... and its late Unlock does not touch the new holder.
	a.do("unlock", "notheld", 10*time.Second)
	w.do("held", "held", 10*time.Second)
	x.do(fmt.Sprintf("trylock %s %v", name, b.ttl), "busy", 10*time.Second)
	w.do("unlock", "unlocked", 10*time.Second)
	x.do(fmt.Sprintf("trylock %s %v", name, b.ttl), "locked", 10*time.Second)
}

func closeFrees(t *testing.T, b backend) {
	name := lockName(t)
	a, w := startWorker(t, b.url), startWorker(t, b.url)
	a.do(fmt.Sprintf("lock %s 1m", name), "locked", 30*time.Second)
	w.do(fmt.Sprintf("trylock %s 1m", name), "busy", 10*time.Second)
	a.do("close", "closed", 30*time.Second)
	w.do(fmt.Sprintf("trylock %s 1m", name), "locked", 10*time.Second)
}

func badInput(t *testing.T, b backend) {
	ctx := context.Background()
	c, err := dlock.Open(ctx, b.url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer c.Close()
	for _, name := range []string{"", strings.Repeat("n", 300), "nul\x00byte", "\xff\xfe"} {
		_, err := c.NewMutex(name, nil).TryLock(ctx)
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock(%q) = %v, want ErrInvalid", name, err)
		}
	}
	_, err = c.NewMutex("ok", &dlock.MutexOptions{TTL: -1}).Lock(ctx)
	if !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Lock with TTL -1 = %v, want ErrInvalid", err)
	}
	sep := "?"
	if strings.Contains(b.url, "?") {
		sep = "&"
	}
	if c2, err := dlock.Open(ctx, b.url+sep+"no_such_param=1"); err == nil {
		_ = c2.Close()
		t.Fatal("Open with an unknown parameter succeeded")
	} else if !strings.Contains(err.Error(), "no_such_param") {
		t.Fatalf("Open error %q does not name the bad parameter", err)
	}
}
