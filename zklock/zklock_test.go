package zklock

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
)

// shared is one standalone ZooKeeper for the tests that do not break servers.
var shared *testserver.Cluster

func TestMain(m *testing.M) {
	queuetest.Main(m, "zklock", "ZK_SERVERS", testserver.StartZooKeeper, &shared)
}

const testSession = 2 * time.Second

// connect opens a connection to servers and waits for its session.
func connect(servers []string, timeout time.Duration) (*zk.Conn, error) {
	conn, events, err := zk.Connect(servers, timeout, zk.WithLogger(nopLogger{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, err
	}
	deadline := time.After(20 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				go func() {
					for range events {
					}
				}()
				return conn, nil
			}
		case <-deadline:
			conn.Close()
			return nil, errors.New("no ZooKeeper session within 20s")
		}
	}
}

func newConn(t testing.TB, servers []string) *zk.Conn {
	t.Helper()
	conn, err := connect(servers, testSession)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// dialDriver returns a driver that opens its own connections to servers,
// one per TTL, as a driver opened from a URL does.
func dialDriver(servers []string, opts *Options) (*Driver, error) {
	return newDialing(&dialer{servers: servers, connectTimeout: 20 * time.Second}, nil, 0, 0, opts)
}

// newTestDriver is dialDriver, closed when t ends.
func newTestDriver(t testing.TB, servers []string, opts *Options) *Driver {
	t.Helper()
	return queuetest.Open(t, func() (*Driver, error) { return dialDriver(servers, opts) })
}

// children lists the lock nodes under path.
func children(t testing.TB, conn *zk.Conn, path string) []string {
	t.Helper()
	cs, _, err := conn.Children(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return queue(cs)
}

// backend is this driver for the tests shared with the other queue-based
// drivers, on the shared server.
func backend(t testing.TB) queuetest.Backend {
	conn := newConn(t, shared.Endpoints())
	parent := func(name string) string { return (&Driver{root: DefaultRoot}).parent(name) }
	return queuetest.Backend{
		NewDriver: func(t testing.TB) queuetest.Driver { return newTestDriver(t, shared.Endpoints(), nil) },
		Queue:     func(t testing.TB, name string) []string { return children(t, conn, parent(name)) },
		Drop: func(t testing.TB, name string) {
			for _, c := range children(t, conn, parent(name)) {
				if err := conn.Delete(parent(name)+"/"+c, -1); err != nil {
					t.Fatal(err)
				}
			}
		},
		TTL: queuetest.Req("", "").TTL, // a lock's TTL is its session's
	}
}

// TestQueue runs the tests shared with the other queue-based drivers.
func TestQueue(t *testing.T) { queuetest.Run(t, backend(t)) }

// TestSessionExpiry cuts a holder's connection until its session expires:
// its grant's Lost closes with ErrSessionLost, a waiter on the same session
// stops, and the driver serves later locks on a new session.
func TestSessionExpiry(t *testing.T) {
	p, err := newProxy(shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	d := newTestDriver(t, []string{p.addr()}, nil)
	other := newTestDriver(t, shared.Endpoints(), nil)
	ctx := queuetest.Ctx(t, 30*time.Second)
	g, err := d.TryAcquire(ctx, queuetest.Req("t6", "A"))
	if err != nil {
		t.Fatal(err)
	}
	gOther, err := other.TryAcquire(ctx, queuetest.Req("t6w", "X"))
	if err != nil {
		t.Fatal(err)
	}
	wait := make(chan error, 1)
	go func() {
		_, err := d.Acquire(ctx, queuetest.Req("t6w", "W"))
		wait <- err
	}()
	admin := newConn(t, shared.Endpoints())
	queuetest.Eventually(t, 5*time.Second, "W queued", func() bool { return len(children(t, admin, "/dlock/t6w")) == 2 })
	// Cut the connection; the proxy refuses reconnects until the session
	// has expired on the server.
	addr := p.addr()
	p.close()
	queuetest.Eventually(t, 10*time.Second, "holder's node deleted by expiry", func() bool { return len(children(t, admin, "/dlock/t6")) == 0 })
	p2, err := newProxyAt(addr, shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p2.close()
	select {
	case <-g.Lost:
		if !errors.Is(g.Cause(), driver.ErrSessionLost) {
			t.Fatalf("Cause = %v", g.Cause())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lost not closed after the session expired")
	}
	select {
	case err := <-wait:
		if !errors.Is(err, driver.ErrSessionLost) {
			t.Fatalf("waiter whose session expired: %v, want ErrSessionLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter kept waiting after its session expired")
	}
	errs, err := d.Renew(ctx, []driver.Lease{queuetest.Lease("t6", "A", g)})
	if err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("Renew after expiry: %v %v", errs, err)
	}
	// go-zookeeper reconnects (through the new proxy) on a new session.
	var g2 driver.Grant
	queuetest.Eventually(t, 10*time.Second, "TryAcquire on a new session", func() bool {
		g2, err = d.TryAcquire(ctx, queuetest.Req("t6", "A"))
		return err == nil
	})
	if g2.Token <= g.Token {
		t.Fatalf("token %d after %d", g2.Token, g.Token)
	}
	d.Release(ctx, queuetest.Lease("t6", "A", g2))
	other.Release(ctx, queuetest.Lease("t6w", "X", gOther))
}

// TestLockDelay: the holder's node is deleted behind its back; the lock
// stays unavailable for the delay from when that is first seen, and the
// guard node goes with a release or after the delay.
func TestLockDelay(t *testing.T) {
	admin := newConn(t, shared.Endpoints())
	queuetest.LockDelay(t, backend(t), queuetest.Delay{
		Delay: 2 * time.Second,
		Lose: func(t testing.TB, _ queuetest.Driver, g driver.Grant) {
			if err := admin.Delete(g.Handle.(*handle).path, -1); err != nil {
				t.Fatal(err)
			}
		},
		Guard: func(t testing.TB, name string) bool {
			ok, _, err := admin.Exists((&Driver{root: DefaultRoot}).parent(name) + "/" + guardName)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		},
		RetryAfter:   true,
		StaleRelease: true,
	})
}

func TestNestedNamesAreIndependent(t *testing.T) {
	a, b := newTestDriver(t, shared.Endpoints(), nil), newTestDriver(t, shared.Endpoints(), nil)
	ctx := queuetest.Ctx(t, 10*time.Second)
	if _, err := a.TryAcquire(ctx, queuetest.Req("t8/x", "A")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"t8", "t8/x/y"} {
		if _, err := b.TryAcquire(ctx, queuetest.Req(name, "B")); err != nil {
			t.Fatalf("TryAcquire %q while %q is held: %v", name, "t8/x", err)
		}
	}
}

func TestEscapeName(t *testing.T) {
	for _, tc := range []struct {
		name   string
		atRoot bool
		want   string
	}{
		{"a", false, "a"},
		{"a/b c/ü", false, "a/b c/ü"},
		{"100%", false, "100%25"},
		{"/a", false, "%2Fa"},
		{"a/", false, "a%2F"},
		{"a//b", false, "a%2F%2Fb"},
		{".", false, "%2E"},
		{"a/../b", false, "a/%2E%2E/b"},
		{"x😀", false, "x%F0%9F%98%80"},
		{"x\u0085", false, "x%C2%85"},
		{"a/0123456789abcdef__lock__0000000001", false, "a/0123456789abcdef%5F_lock__0000000001"},
		{"a/_c_x-lock-0000000001", false, "a/_c_x-%6Cock-0000000001"}, // a Curator mutex node of a
		{"a/lock-0000000001", false, "a/%6Cock-0000000001"},
		{"a/lock-000000001", false, "a/lock-000000001"},
		{"zookeeper/x", true, "%7Aookeeper/x"},
		{"zookeeper/x", false, "zookeeper/x"},
		{"a/dlock-delay", false, "a/%64lock-delay"},
		{"a/dlock-rw", false, "a/%64lock-rw"},   // a's read/write lock lives at a/dlock-rw
		{"dlock-sem/b", false, "%64lock-sem/b"}, // and its semaphore at a/dlock-sem
		{"a/dlock-rwx", false, "a/dlock-rwx"},
	} {
		got := escapeName(tc.name, tc.atRoot)
		if got != tc.want {
			t.Errorf("escapeName(%q) = %q, want %q", tc.name, got, tc.want)
		}
		if err := checkSegments(got); err != nil && !(tc.atRoot && got == "zookeeper") {
			t.Errorf("escapeName(%q) = %q is not a valid path: %v", tc.name, got, err)
		}
	}
	// Every such name works on a real server.
	d := newTestDriver(t, shared.Endpoints(), nil)
	ctx := queuetest.Ctx(t, 10*time.Second)
	for _, name := range []string{"/a", "a//b", "..", "x😀", "100%"} {
		g, err := d.TryAcquire(ctx, queuetest.Req(name, "A"))
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", name, err)
		}
		d.Release(ctx, queuetest.Lease(name, "A", g))
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := New(nil, nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	for _, root := range []string{"x", "/x/", "/a//b"} {
		if _, err := New(&zk.Conn{}, &Options{Root: root}); err == nil || !strings.Contains(err.Error(), "root") {
			t.Errorf("root %q: %v", root, err)
		}
	}
	if _, err := New(&zk.Conn{}, &Options{SessionTimeout: -1}); err == nil {
		t.Error("negative SessionTimeout accepted")
	}
}

func TestParseURL(t *testing.T) {
	type parsed struct {
		s    []string
		o    *Options
		auth string
	}
	queuetest.ParseURL(t, func(u *url.URL) (parsed, error) {
		s, o, auth, _, err := parseURL(u)
		return parsed{s, o, auth}, err
	}, []queuetest.URLCase[parsed]{
		{URL: "zk://a:1,b:2", Check: func(p parsed) bool {
			s, o, auth := p.s, p.o, p.auth
			return strings.Join(s, ",") == "a:1,b:2" && o.Root == "" && auth == ""
		}},
		{URL: "zk://a/locks/app?session_timeout=5s&acl=creator_read", Err: "creator needs"},
		{URL: "zk://u:s3cret@a/locks/app?session_timeout=5s&acl=creator_read", Check: func(p parsed) bool {
			s, o, auth := p.s, p.o, p.auth
			return s[0] == "a:2181" && o.Root == "/locks/app" && o.SessionTimeout == 5*time.Second && auth == "u:s3cret" && len(o.ACL) == 2
		}},
		{URL: "zk://u:s3cret@a?bogus=1", Err: `unknown url parameter "bogus"`},
		{URL: "zk://a?acl=everyone", Err: "acl"},
		{URL: "zk://a?layout=curator", Check: func(p parsed) bool { return p.o.Layout == LayoutCurator }},
		{URL: "zk://a?layout=kazoo", Check: func(p parsed) bool { return p.o.Layout == LayoutKazoo }},
		{URL: "zk://a?layout=zk", Err: "layout"},
		{URL: "zk://a/x/", Err: "root"},
		{URL: "zk:///x", Err: "no hosts"},
		{URL: "etcd://u:s3cret@a:2181", Err: "scheme"},
	})
}

func TestOpenURLWithDigestAuth(t *testing.T) {
	queuetest.OpenURL(t, OpenURL, "zk://alice:pw@"+strings.Join(shared.Endpoints(), ",")+"/authlocks?session_timeout=2s&acl=creator", "zk://127.0.0.1:1?connect_timeout=300ms", func() {
		// Without alice's credentials the queue cannot be joined.
		stranger := newTestDriver(t, shared.Endpoints(), &Options{Root: "/authlocks"})
		if _, err := stranger.TryAcquire(queuetest.Ctx(t, 5*time.Second), queuetest.Req("x", "B")); !errors.Is(err, zk.ErrNoAuth) {
			t.Fatalf("TryAcquire without auth: %v, want ErrNoAuth", err)
		}
	})
}

// kazooScript holds or tries a kazoo Lock, driven over stdin/stdout.
const kazooScript = `
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1], timeout=float(sys.argv[4]))
zk.start(timeout=15)
lock = zk.Lock(sys.argv[2], "kazoo", extra_lock_patterns=sys.argv[5:])
mode = sys.argv[3]
if mode == "try":
    got = lock.acquire(blocking=False)
    print("got" if got else "busy", flush=True)
    if got:
        lock.release()
else:
    print("waiting", flush=True)
    lock.acquire()
    print("locked", flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
zk.stop()
zk.close()
`

type kazoo struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startKazoo(t *testing.T, path, mode string) *kazoo {
	t.Helper()
	return startKazooSession(t, path, mode, 10*time.Second)
}

// startKazooSession is startKazoo with kazoo's session timeout and the
// Lock's extra_lock_patterns.
func startKazooSession(t *testing.T, path, mode string, session time.Duration, extra ...string) *kazoo {
	t.Helper()
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import kazoo").Run(); err != nil {
		t.Fatalf("kazoo interop needs %s with python3-kazoo (`make deps` installs it): %v", python, err)
	}
	script := filepath.Join(t.TempDir(), "kazoo_lock.py")
	if err := os.WriteFile(script, []byte(kazooScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script, strings.Join(shared.Endpoints(), ","), path, mode, fmt.Sprint(session.Seconds()))
	cmd.Args = append(cmd.Args, extra...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k := &kazoo{cmd: cmd, stdin: stdin, lines: make(chan string, 10)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			k.lines <- sc.Text()
		}
		close(k.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return k
}

func (k *kazoo) expect(t *testing.T, want string, within time.Duration) time.Time {
	t.Helper()
	select {
	case got, ok := <-k.lines:
		if !ok || got != want {
			t.Fatalf("kazoo said %q (open %v), want %q", got, ok, want)
		}
	case <-time.After(within):
		t.Fatalf("kazoo did not say %q within %v", want, within)
	}
	return time.Now()
}

func (k *kazoo) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case got := <-k.lines:
		t.Fatalf("kazoo said %q, want nothing yet", got)
	case <-time.After(d):
	}
}

// TestInteropWithKazoo shows that a dlock lock and Python kazoo's Lock on the
// same path exclude each other and share one queue.
func TestInteropWithKazoo(t *testing.T) {
	d := newTestDriver(t, shared.Endpoints(), nil)
	ctx := queuetest.Ctx(t, 60*time.Second)

	// kazoo holds: dlock is refused, then queues and gets the lock when
	// kazoo releases.
	k := startKazoo(t, "/dlock/kazoo1", "hold")
	k.expect(t, "waiting", 20*time.Second)
	k.expect(t, "locked", 20*time.Second)
	admin := newConn(t, shared.Endpoints())
	var released time.Time
	g := queuetest.BehindForeign(t, ctx, backend(t), d, "kazoo1", "kazoo", func() {
		io.WriteString(k.stdin, "release\n")
		released = k.expect(t, "released", 10*time.Second)
	})
	checkHandOver(t, "kazoo → dlock", released, time.Now())

	// dlock holds: kazoo's non-blocking acquire fails; its blocking
	// acquire waits until dlock releases.
	try := startKazoo(t, "/dlock/kazoo1", "try")
	try.expect(t, "busy", 20*time.Second)
	w := startKazoo(t, "/dlock/kazoo1", "hold")
	w.expect(t, "waiting", 20*time.Second)
	queuetest.Eventually(t, 20*time.Second, "kazoo queued behind dlock", func() bool { return len(children(t, admin, "/dlock/kazoo1")) == 2 })
	w.quiet(t, 300*time.Millisecond)
	start := time.Now()
	if _, err := d.Release(ctx, queuetest.Lease("kazoo1", "A", g)); err != nil {
		t.Fatal(err)
	}
	checkHandOver(t, "dlock → kazoo", start, w.expect(t, "locked", 10*time.Second))
	io.WriteString(w.stdin, "release\n")
	w.expect(t, "released", 10*time.Second)
}

// TestKazooWithCuratorLayout: kazoo told to count Curator's nodes
// (extra_lock_patterns=["-lock-"], kazoo 2.7.1 and later) and dlock with
// layout=curator exclude each other both ways.
func TestKazooWithCuratorLayout(t *testing.T) {
	d := newTestDriver(t, shared.Endpoints(), &Options{Layout: LayoutCurator})
	ctx := queuetest.Ctx(t, 60*time.Second)
	k := startKazooSession(t, "/dlock/kazoocur", "hold", 10*time.Second, "-lock-")
	k.expect(t, "waiting", 20*time.Second)
	k.expect(t, "locked", 20*time.Second)
	if _, err := d.TryAcquire(ctx, queuetest.Req("kazoocur", "A")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("dlock (curator layout) TryAcquire while kazoo holds: %v, want ErrLocked", err)
	}
	io.WriteString(k.stdin, "release\n")
	k.expect(t, "released", 10*time.Second)
	g, err := d.TryAcquire(ctx, queuetest.Req("kazoocur", "A"))
	if err != nil {
		t.Fatal(err)
	}
	try := startKazooSession(t, "/dlock/kazoocur", "try", 10*time.Second, "-lock-")
	try.expect(t, "busy", 20*time.Second)
	if _, err := d.Release(ctx, queuetest.Lease("kazoocur", "A", g)); err != nil {
		t.Fatal(err)
	}
}

// TestKazooCrash: a crashed holder's lock is freed by its own expiry rules
// both ways. A kazoo process killed while it holds loses the lock when its
// session (2s) expires, and so does a dlock holder cut off from the
// ensemble, each to a waiter of the other client.
func TestKazooCrash(t *testing.T) {
	d := newTestDriver(t, shared.Endpoints(), nil)
	ctx := queuetest.Ctx(t, 60*time.Second)
	k := startKazooSession(t, "/dlock/kazoocrash", "hold", 2*time.Second)
	k.expect(t, "waiting", 20*time.Second)
	k.expect(t, "locked", 20*time.Second)
	ch := acquiring(ctx, d, queuetest.Req("kazoocrash", "A"))
	notYet(t, ch, 300*time.Millisecond, "dlock Acquire")
	if err := k.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	a := waitAcquired(t, ch, 20*time.Second, "dlock behind a killed kazoo")
	g := a.must(t, "dlock behind a killed kazoo")
	t.Logf("killed kazoo's lock went to dlock after %v (session 2s)", a.at.Sub(killed).Round(time.Millisecond))
	if _, err := d.Release(ctx, queuetest.Lease("kazoocrash", "A", g)); err != nil {
		t.Fatal(err)
	}

	p, err := newProxy(shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	cut := newTestDriver(t, []string{p.addr()}, nil)
	if _, err := cut.TryAcquire(ctx, queuetest.Req("kazoocrash", "B")); err != nil {
		t.Fatal(err)
	}
	w := startKazooSession(t, "/dlock/kazoocrash", "hold", 2*time.Second)
	w.expect(t, "waiting", 20*time.Second)
	w.quiet(t, 300*time.Millisecond)
	p.close()
	start := time.Now()
	w.expect(t, "locked", 20*time.Second)
	t.Logf("cut-off dlock holder's lock went to kazoo after %v", time.Since(start).Round(time.Millisecond))
	io.WriteString(w.stdin, "release\n")
	w.expect(t, "released", 10*time.Second)
}

func TestInspect(t *testing.T) {
	queuetest.Inspect(t, backend(t), "insp/%😀", "insp/x/deeper")
}

// TestCutOffHolderGivesUp cuts a holder off from every server for good: it
// must report its grant lost within the session timeout of its last answered
// request, without waiting to hear from a server that its session expired.
func TestCutOffHolderGivesUp(t *testing.T) {
	p, err := newProxy(shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	d := newTestDriver(t, []string{p.addr()}, nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	g, err := d.TryAcquire(ctx, queuetest.Req("cutoff", "A"))
	if err != nil {
		t.Fatal(err)
	}
	p.close()
	cut := time.Now()
	select {
	case <-g.Lost:
		t.Logf("lost %v after the cut: %v", time.Since(cut).Round(time.Millisecond), g.Cause())
		if !errors.Is(g.Cause(), driver.ErrSessionLost) {
			t.Fatalf("Cause = %v", g.Cause())
		}
		if time.Since(cut) > g.TTL+time.Second {
			t.Fatalf("lost only %v after the cut (session timeout %v)", time.Since(cut), g.TTL)
		}
	case <-time.After(3 * testSession):
		t.Fatal("Lost not closed while cut off from every server")
	}
}
