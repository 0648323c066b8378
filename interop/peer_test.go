package interop

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// peer is a foreign client driven over stdin/stdout: it answers each command
// with lines "ID what".
type peer struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu    sync.Mutex
	lines []string
	more  chan struct{} // closed and replaced when a line arrives
	eof   bool
}

func startPeer(t *testing.T, name string, cmd *exec.Cmd) *peer {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &peer{t: t, name: name, cmd: cmd, stdin: stdin, more: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			close(p.more)
			p.more = make(chan struct{})
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.eof = true
		close(p.more)
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-done
	})
	return p
}

// use makes t the test the peer reports to (a subtest's).
func (p *peer) use(t *testing.T) {
	p.mu.Lock()
	p.t = t
	p.mu.Unlock()
}

// send writes one command line.
func (p *peer) send(format string, args ...any) {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.stdin, format+"\n", args...); err != nil {
		p.t.Fatalf("%s: send: %v", p.name, err)
	}
}

// take removes and returns the first line that want accepts.
func (p *peer) take(want func(string) bool) (string, bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, l := range p.lines {
		if strings.HasPrefix(l, "error") {
			p.t.Errorf("%s said %q", p.name, l)
		}
		if want(l) {
			p.lines = slices.Delete(p.lines, i, i+1)
			return l, true, nil
		}
	}
	if p.eof {
		return "", false, nil
	}
	return "", false, p.more
}

// expect waits for the line want (other lines stay for later) and returns
// when it arrived.
func (p *peer) expect(want string, within time.Duration) time.Time {
	p.t.Helper()
	deadline := time.After(within)
	for {
		_, ok, more := p.take(func(l string) bool { return l == want })
		if ok {
			return time.Now()
		}
		if more == nil {
			p.t.Fatalf("%s exited before saying %q", p.name, want)
		}
		select {
		case <-more:
		case <-deadline:
			p.mu.Lock()
			lines := slices.Clone(p.lines)
			p.mu.Unlock()
			p.t.Fatalf("%s did not say %q within %v (unread: %q)", p.name, want, within, lines)
		}
	}
}

// quiet fails if a line starting with prefix arrives within d.
func (p *peer) quiet(prefix string, d time.Duration) {
	p.t.Helper()
	deadline := time.After(d)
	for {
		l, ok, more := p.take(func(l string) bool { return strings.HasPrefix(l, prefix) })
		if ok {
			p.t.Fatalf("%s said %q, want nothing from %q yet", p.name, l, prefix)
		}
		if more == nil {
			return
		}
		select {
		case <-more:
		case <-deadline:
			return
		}
	}
}

// python is the interpreter with Debian's python3-redis.
const python = "/usr/bin/python3"

// startPython runs a Python peer script from testdata with args and waits
// for its "ready".
func startPython(t *testing.T, name, script string, args ...string) *peer {
	t.Helper()
	if err := exec.Command(python, "-c", "import redis").Run(); err != nil {
		t.Fatalf("%s needs redis-py (Debian: python3-redis; `make deps` installs it): %v", name, err)
	}
	p := startPeer(t, name, exec.Command(python, append([]string{"testdata/" + script}, args...)...))
	p.expect("ready", 30*time.Second)
	return p
}

// expectPrefix waits for a line starting with prefix (other lines stay for
// later) and returns it and when it arrived.
func (p *peer) expectPrefix(prefix string, within time.Duration) (string, time.Time) {
	p.t.Helper()
	l, at, ok := p.waitPrefix(prefix, within)
	if !ok {
		p.t.Fatalf("%s did not say %q… within %v", p.name, prefix, within)
	}
	return l, at
}

// waitPrefix is expectPrefix without failing the test (for goroutines):
// ok is false when no such line came within the time or the peer exited.
func (p *peer) waitPrefix(prefix string, within time.Duration) (string, time.Time, bool) {
	deadline := time.After(within)
	for {
		l, ok, more := p.take(func(l string) bool { return strings.HasPrefix(l, prefix) })
		if ok {
			return l, time.Now(), true
		}
		if more == nil {
			return "", time.Time{}, false
		}
		select {
		case <-more:
		case <-deadline:
			return "", time.Time{}, false
		}
	}
}
