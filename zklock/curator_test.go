package zklock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// handOver bounds how long a waiter may take to get a lock its holder in
// another client released: a watch fires at once, so this is generous.
const handOver = time.Second

// curatorJars are the Debian packages' jars (libcurator-recipes-java and its
// dependencies) that the Curator peer runs on.
var curatorJars = []string{
	"curator-recipes.jar", "curator-framework.jar", "curator-client.jar",
	"zookeeper.jar", "zookeeper-jute.jar", "guava.jar", "slf4j-api.jar", "slf4j-nop.jar",
}

// buildCurator compiles testdata/CuratorPeer.java into a temporary
// directory and returns the classpath to run it with.
func buildCurator(t *testing.T) string {
	t.Helper()
	var cp []string
	for _, j := range curatorJars {
		p := filepath.Join("/usr/share/java", j)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("Curator interop needs %s (Debian: libcurator-recipes-java, default-jdk-headless; `make deps` installs them): %v", p, err)
		}
		cp = append(cp, p)
	}
	if _, err := exec.LookPath("javac"); err != nil {
		t.Fatalf("Curator interop needs javac (Debian: default-jdk-headless; `make deps` installs it): %v", err)
	}
	dir := t.TempDir()
	out, err := exec.Command("javac", "-nowarn", "-cp", strings.Join(cp, ":"), "-d", dir, "testdata/CuratorPeer.java").CombinedOutput()
	if err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	return strings.Join(append(cp, dir), ":")
}

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

// startCurator starts the Curator peer (a JVM) with a session timeout.
func startCurator(t *testing.T, classpath string, session time.Duration) *peer {
	t.Helper()
	cmd := exec.Command("java", "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp", classpath, "CuratorPeer",
		strings.Join(shared.Endpoints(), ","), fmt.Sprint(session.Milliseconds()))
	p := startPeer(t, "Curator", cmd)
	p.expect("ready", 60*time.Second)
	return p
}

// acquiring runs d.Acquire in the background.
func acquiring(ctx context.Context, d *Driver, req driver.AcquireRequest) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		g, err := d.Acquire(ctx, req)
		ch <- acquired{g, err, time.Now()}
	}()
	return ch
}

type acquired struct {
	g   driver.Grant
	err error
	at  time.Time
}

func (a acquired) must(t *testing.T, what string) driver.Grant {
	t.Helper()
	if a.err != nil {
		t.Fatalf("%s: %v", what, a.err)
	}
	return a.g
}

func waitAcquired(t *testing.T, ch <-chan acquired, within time.Duration, what string) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(within):
		t.Fatalf("%s: not granted within %v", what, within)
	}
	panic("unreachable")
}

func notYet(t *testing.T, ch <-chan acquired, d time.Duration, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s granted while the other client holds it (err %v)", what, a.err)
	case <-time.After(d):
	}
}

func checkHandOver(t *testing.T, what string, released, granted time.Time) {
	t.Helper()
	took := granted.Sub(released)
	t.Logf("hand-over %s: %v", what, took.Round(time.Millisecond))
	if took > handOver {
		t.Fatalf("hand-over %s took %v, want at most %v", what, took, handOver)
	}
}

func kindReq(k driver.Kind, name, owner string, permits int) driver.AcquireRequest {
	return queuetest.KindReq(k, name, owner, permits)
}

// TestInteropWithCurator shows that dlock and Apache Curator 5.4 (run in a
// JVM, driven over stdin) share locks both ways: InterProcessMutex with
// layout=curator, InterProcessReadWriteLock and InterProcessSemaphoreV2 with
// dlock's read/write locks and semaphores. For each: the other's try fails
// while one holds, a waiter in either gets the lock within a second of the
// other's release, and Inspect shows a Curator holder as held.
func TestInteropWithCurator(t *testing.T) {
	cp := buildCurator(t)
	cur := startCurator(t, cp, 20*time.Second)
	d := newTestDriver(t, shared.Endpoints(), &Options{Layout: LayoutCurator})
	kazooLayout := newTestDriver(t, shared.Endpoints(), nil)
	admin := newConn(t, shared.Endpoints())
	ctx := queuetest.Ctx(t, 120*time.Second)

	t.Run("mutex", func(t *testing.T) {
		cur.t = t
		const name = "cur/mutex"
		path := d.parent(name)
		cur.send("mutex m %s", path)
		cur.send("lock m")
		cur.expect("m waiting", 10*time.Second)
		cur.expect("m locked", 20*time.Second)

		// Curator holds: dlock's try fails (in either layout), status
		// shows the holder, and a waiting dlock gets the lock at once
		// when Curator lets go.
		if _, err := d.TryAcquire(ctx, queuetest.Req(name, "A")); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("dlock TryAcquire while Curator holds: %v, want ErrLocked", err)
		}
		if _, err := kazooLayout.TryAcquire(ctx, queuetest.Req(name, "A")); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("dlock (kazoo layout) TryAcquire while Curator holds: %v, want ErrLocked", err)
		}
		infos, err := d.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Name != name || infos[0].Token == 0 || infos[0].Owner == "" {
			t.Fatalf("Inspect while Curator holds: %+v, want %q held", infos, name)
		}
		t.Logf("Curator's hold in status: %+v", infos[0])
		ch := acquiring(ctx, d, queuetest.Req(name, "A"))
		queuetest.Eventually(t, 10*time.Second, "dlock queued behind Curator", func() bool { return len(children(t, admin, path)) == 2 })
		notYet(t, ch, 300*time.Millisecond, "dlock Acquire")
		cur.send("release m")
		released := cur.expect("m released", 10*time.Second)
		a := waitAcquired(t, ch, 10*time.Second, "dlock behind Curator")
		g := a.must(t, "dlock behind Curator")
		checkHandOver(t, "Curator → dlock", released, a.at)
		if g.Token <= infos[0].Token {
			t.Fatalf("dlock's token %d is not above Curator's %d", g.Token, infos[0].Token)
		}

		// dlock holds: Curator's try fails and its waiter gets the lock
		// when dlock releases.
		cur.send("try m")
		cur.expect("m busy", 10*time.Second)
		cur.send("lock m")
		cur.expect("m waiting", 10*time.Second)
		queuetest.Eventually(t, 10*time.Second, "Curator queued behind dlock", func() bool { return len(children(t, admin, path)) == 2 })
		cur.quiet("m", 300*time.Millisecond)
		start := time.Now()
		if _, err := d.Release(ctx, queuetest.Lease(name, "A", g)); err != nil {
			t.Fatal(err)
		}
		checkHandOver(t, "dlock → Curator", start, cur.expect("m locked", 10*time.Second))
		cur.send("release m")
		cur.expect("m released", 10*time.Second)
	})

	t.Run("rwlock", func(t *testing.T) {
		cur.t = t
		const name = "cur/rw"
		path := d.kindPath(driver.Write, name)
		cur.send("write w %s", path)
		cur.send("read r %s", path)
		cur.send("lock w")
		cur.expect("w waiting", 10*time.Second)
		cur.expect("w locked", 20*time.Second)

		// Curator writes: dlock can neither read nor write; a waiting
		// dlock reader gets in when the writer leaves.
		for _, k := range []driver.Kind{driver.Read, driver.Write} {
			if _, err := d.TryAcquire(ctx, kindReq(k, name, "A", 0)); !errors.Is(err, driver.ErrLocked) {
				t.Fatalf("dlock Try%v while Curator writes: %v, want ErrLocked", k, err)
			}
		}
		infos, err := d.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Kind != driver.Write || infos[0].Count != 1 || infos[0].Readers != 0 {
			t.Fatalf("Inspect while Curator writes: %+v, want one writer", infos)
		}
		ch := acquiring(ctx, d, kindReq(driver.Read, name, "A", 0))
		notYet(t, ch, 300*time.Millisecond, "dlock read")
		cur.send("release w")
		released := cur.expect("w released", 10*time.Second)
		a := waitAcquired(t, ch, 10*time.Second, "dlock reader behind Curator's writer")
		rg := a.must(t, "dlock read")
		checkHandOver(t, "Curator writer → dlock reader", released, a.at)

		// dlock reads: Curator reads too, Curator's writer waits for both
		// readers, and holds dlock's writer off once it has the lock.
		cur.send("try r")
		cur.expect("r got", 10*time.Second)
		cur.send("try w")
		cur.expect("w busy", 10*time.Second)
		cur.send("lock w")
		cur.expect("w waiting", 10*time.Second)
		cur.quiet("w", 300*time.Millisecond)
		cur.send("release r")
		cur.expect("r released", 10*time.Second)
		cur.quiet("w", 300*time.Millisecond)
		start := time.Now()
		if _, err := d.Release(ctx, queuetest.KindLease(kindReq(driver.Read, name, "A", 0), rg)); err != nil {
			t.Fatal(err)
		}
		checkHandOver(t, "dlock reader → Curator writer", start, cur.expect("w locked", 10*time.Second))
		ch = acquiring(ctx, d, kindReq(driver.Write, name, "A", 0))
		notYet(t, ch, 300*time.Millisecond, "dlock write")
		cur.send("release w")
		released = cur.expect("w released", 10*time.Second)
		a = waitAcquired(t, ch, 10*time.Second, "dlock writer behind Curator's writer")
		wg := a.must(t, "dlock write")
		checkHandOver(t, "Curator writer → dlock writer", released, a.at)
		cur.send("try r")
		cur.expect("r busy", 10*time.Second)
		if _, err := d.Release(ctx, queuetest.KindLease(kindReq(driver.Write, name, "A", 0), wg)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("semaphore", func(t *testing.T) {
		cur.t = t
		const name = "cur/sem"
		path := d.kindPath(driver.Permit, name)
		cur.send("sem s1 %s 2", path)
		cur.send("sem s2 %s 2", path)
		cur.send("try s1")
		cur.expect("s1 got", 20*time.Second)
		g1, err := d.TryAcquire(ctx, kindReq(driver.Permit, name, "A", 2))
		if err != nil {
			t.Fatalf("dlock's permit beside Curator's one of 2: %v", err)
		}
		// Full: neither gets a third permit; Curator's waiter gets dlock's
		// when it is returned, and dlock's waiter Curator's.
		if _, err := d.TryAcquire(ctx, kindReq(driver.Permit, name, "B", 2)); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("dlock's third permit of 2: %v, want ErrLocked", err)
		}
		cur.send("try s2")
		cur.expect("s2 busy", 10*time.Second)
		infos, err := d.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Kind != driver.Permit || infos[0].Count != 2 {
			t.Fatalf("Inspect of a full semaphore: %+v, want 2 holders", infos)
		}
		cur.send("lock s2")
		cur.expect("s2 waiting", 10*time.Second)
		cur.quiet("s2", 300*time.Millisecond)
		start := time.Now()
		if _, err := d.Release(ctx, queuetest.KindLease(kindReq(driver.Permit, name, "A", 2), g1)); err != nil {
			t.Fatal(err)
		}
		checkHandOver(t, "dlock permit → Curator", start, cur.expect("s2 locked", 10*time.Second))
		ch := acquiring(ctx, d, kindReq(driver.Permit, name, "B", 2))
		notYet(t, ch, 300*time.Millisecond, "dlock permit")
		cur.send("release s1")
		released := cur.expect("s1 released", 10*time.Second)
		a := waitAcquired(t, ch, 10*time.Second, "dlock permit behind Curator's")
		g := a.must(t, "dlock permit")
		checkHandOver(t, "Curator permit → dlock", released, a.at)
		cur.send("release s2")
		cur.expect("s2 released", 10*time.Second)
		if _, err := d.Release(ctx, queuetest.KindLease(kindReq(driver.Permit, name, "B", 2), g)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCuratorCrash shows that a crashed holder's lock is freed by its own
// expiry rules both ways: a Curator JVM killed while it holds loses the lock
// when its session expires, and so does a dlock holder cut off from the
// ensemble, each to a waiter of the other client.
func TestCuratorCrash(t *testing.T) {
	cp := buildCurator(t)
	const session = 2 * time.Second
	d := newTestDriver(t, shared.Endpoints(), &Options{Layout: LayoutCurator})
	admin := newConn(t, shared.Endpoints())
	ctx := queuetest.Ctx(t, 90*time.Second)
	const name = "cur/crash"
	path := d.parent(name)

	// Curator holds and is killed: dlock's waiter gets the lock once the
	// JVM's session expires.
	cur := startCurator(t, cp, session)
	cur.send("mutex m %s", path)
	cur.send("lock m")
	cur.expect("m waiting", 10*time.Second)
	cur.expect("m locked", 20*time.Second)
	ch := acquiring(ctx, d, queuetest.Req(name, "A"))
	queuetest.Eventually(t, 10*time.Second, "dlock queued behind Curator", func() bool { return len(children(t, admin, path)) == 2 })
	if err := cur.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	a := waitAcquired(t, ch, 20*time.Second, "dlock behind a killed Curator")
	g := a.must(t, "dlock behind a killed Curator")
	t.Logf("killed Curator's lock went to dlock after %v (session %v)", a.at.Sub(killed).Round(time.Millisecond), session)
	if _, err := d.Release(ctx, queuetest.Lease(name, "A", g)); err != nil {
		t.Fatal(err)
	}

	// dlock holds and is cut off: Curator's waiter gets the lock once
	// dlock's session expires.
	p, err := newProxy(shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	cut := newTestDriver(t, []string{p.addr()}, &Options{Layout: LayoutCurator})
	if _, err := cut.TryAcquire(ctx, queuetest.Req(name, "B")); err != nil {
		t.Fatal(err)
	}
	cur = startCurator(t, cp, session)
	cur.send("mutex m %s", path)
	cur.send("lock m")
	cur.expect("m waiting", 10*time.Second)
	cur.quiet("m", 300*time.Millisecond)
	p.close()
	start := time.Now()
	cur.expect("m locked", 20*time.Second)
	t.Logf("cut-off dlock holder's lock went to Curator after %v (session %v)", time.Since(start).Round(time.Millisecond), session)
	cur.send("release m")
	cur.expect("m released", 10*time.Second)
}
