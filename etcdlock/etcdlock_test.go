package etcdlock

import (
	"bufio"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
)

// shared is one single-member etcd for the tests that do not break servers.
var shared *testserver.Cluster

func TestMain(m *testing.M) {
	queuetest.Main(m, "etcdlock", "ETCD_ENDPOINTS", testserver.StartEtcd, &shared, goleakOptions()...)
}

// goleakOptions: none. grpc-go's resolver and balancer goroutines finish
// shortly after ClientConn.Close returns; goleak.Find retries until they do.
func goleakOptions() []goleak.Option { return nil }

func newClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func newTestDriver(t testing.TB, cli *clientv3.Client, opts *Options) *Driver {
	t.Helper()
	return queuetest.Open(t, func() (*Driver, error) { return New(cli, opts) })
}

// keys lists the keys under prefix.
func keys(t testing.TB, cli *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := cli.Get(queuetest.Ctx(t, 5*time.Second), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(prefix, "/") && !inQueue(prefix, kv.Key) {
			continue // a nested name's key
		}
		ks = append(ks, string(kv.Key))
	}
	return ks
}

// backend is this driver for the tests shared with the other queue-based
// drivers, on the shared server.
func backend(t testing.TB) queuetest.Backend {
	cli := newClient(t, shared.Endpoints())
	return queuetest.Backend{
		NewDriver: func(t testing.TB) queuetest.Driver { return newTestDriver(t, newClient(t, shared.Endpoints()), nil) },
		Queue:     func(t testing.TB, name string) []string { return keys(t, cli, (&Driver{}).queuePrefix(name)) },
		Drop: func(t testing.TB, name string) {
			if _, err := cli.Delete(queuetest.Ctx(t, 5*time.Second), (&Driver{}).queuePrefix(name), clientv3.WithPrefix()); err != nil {
				t.Fatal(err)
			}
		},
		TTL:           2 * time.Second,
		CleanupAtOnce: true,
	}
}

// TestQueue runs the tests shared with the other queue-based drivers.
func TestQueue(t *testing.T) { queuetest.Run(t, backend(t)) }

func TestLeaseLossClosesLostAndStopsWaiters(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	a, b := newTestDriver(t, cli, nil), newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	ga, err := a.TryAcquire(ctx, queuetest.Req("t7", "A"))
	if err != nil {
		t.Fatal(err)
	}
	wait := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, queuetest.Req("t7", "B"))
		wait <- err
	}()
	queuetest.Eventually(t, 5*time.Second, "B queued", func() bool { return len(keys(t, cli, "t7/")) == 2 })
	// B's lease ends while it waits (etcd #19597): B must stop with an error.
	if _, err := cli.Revoke(ctx, onlySession(t, b).id); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wait:
		if !errors.Is(err, driver.ErrSessionLost) {
			t.Fatalf("waiter whose lease ended: %v, want ErrSessionLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter kept waiting after its lease ended")
	}
	// A's lease ends: its grant's Lost closes with ErrSessionLost.
	if _, err := cli.Revoke(ctx, ga.Handle.(*handle).sess.id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ga.Lost:
		if !errors.Is(ga.Cause(), driver.ErrSessionLost) {
			t.Fatalf("Cause = %v", ga.Cause())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after the lease was revoked")
	}
	errs, err := a.Renew(ctx, []driver.Lease{queuetest.Lease("t7", "A", ga)})
	if err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("Renew after loss: %v %v", errs, err)
	}
	// A new lease serves later locks.
	g2, err := a.TryAcquire(ctx, queuetest.Req("t7", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= ga.Token {
		t.Fatalf("token %d after %d", g2.Token, ga.Token)
	}
	a.Release(ctx, queuetest.Lease("t7", "A", g2))
}

// TestLockDelay: a crashed holder's key goes with its lease; the lock stays
// unavailable for the delay after that.
func TestLockDelay(t *testing.T) {
	be := backend(t)
	queuetest.LockDelay(t, be, queuetest.Delay{
		Delay: 3 * time.Second,
		Lose: func(t testing.TB, qd queuetest.Driver, g driver.Grant) {
			d := qd.(*Driver)
			d.stop()
			d.cli.Close()
			queuetest.Eventually(t, 10*time.Second, "crashed holder's key expired", func() bool { return len(be.Queue(t, "ld2")) == 0 })
		},
		// The key expired somewhere in the poll interval before it was seen gone.
		Slack: 100 * time.Millisecond,
	})
}

func TestNamesDoNotCollide(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	a, b := newTestDriver(t, cli, nil), newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 10*time.Second)
	if _, err := a.TryAcquire(ctx, queuetest.Req("t9/x", "A")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"t9", "t9%2Fx", "t9/x/y"} {
		if _, err := b.TryAcquire(ctx, queuetest.Req(name, "B")); err != nil {
			t.Fatalf("TryAcquire %q while %q is held: %v", name, "t9/x", err)
		}
	}
}

// TestInteropWithConcurrencyMutex shows that a dlock lock and etcd's own
// concurrency.Mutex on the same name (empty prefix) exclude each other.
func TestInteropWithConcurrencyMutex(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, "interop")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	g := queuetest.BehindForeign(t, ctx, backend(t), d, "interop", "concurrency.Mutex", func() {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("concurrency.Mutex TryLock while dlock holds: %v, want ErrLocked", err)
	}
	if g.Token <= uint64(m.Header().Revision) {
		t.Fatalf("dlock token %d not above the mutex's revision %d", g.Token, m.Header().Revision)
	}
	if _, err := d.Release(ctx, queuetest.Lease("interop", "A", g)); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	m.Unlock(ctx)
}

func TestCloseRevokesLease(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d, err := New(newClient(t, shared.Endpoints()), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := queuetest.Ctx(t, 10*time.Second)
	// A lease that would outlive the test: only the revoke deletes the key.
	if _, err := d.TryAcquire(ctx, reqTTL("t10", "A", 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, cli, "t10/"); len(ks) != 0 {
		t.Fatalf("keys after Close: %q", ks)
	}
}

func TestPrefix(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d := newTestDriver(t, cli, &Options{Prefix: "/app/locks/"})
	if _, err := d.TryAcquire(queuetest.Ctx(t, 5*time.Second), queuetest.Req("p", "A")); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, cli, "/app/locks/p/"); len(ks) != 1 {
		t.Fatalf("keys under the prefix: %q", ks)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := New(nil, nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := New(&clientv3.Client{}, &Options{SessionTTL: -time.Second}); err == nil || !strings.Contains(err.Error(), "SessionTTL") {
		t.Fatalf("negative SessionTTL: %v", err)
	}
}

func TestParseURL(t *testing.T) {
	type parsed struct {
		c clientv3.Config
		o *Options
	}
	queuetest.ParseURL(t, func(u *url.URL) (parsed, error) {
		c, o, err := parseURL(u)
		return parsed{c, o}, err
	}, []queuetest.URLCase[parsed]{
		{URL: "etcd://a:1,b:2", Check: func(p parsed) bool {
			c, o := p.c, p.o
			return strings.Join(c.Endpoints, ",") == "a:1,b:2" && o.Prefix == "" && c.TLS == nil
		}},
		{URL: "etcd://a/locks/?session_ttl=15s", Check: func(p parsed) bool {
			c, o := p.c, p.o
			return c.Endpoints[0] == "a:2379" && o.Prefix == "locks/" && o.SessionTTL == 15*time.Second
		}},
		{URL: "etcd://a//locks/", Check: func(p parsed) bool { return p.o.Prefix == "/locks/" }},
		{URL: "etcd://u:s3cret@a?tls=true&server_name=x", Check: func(p parsed) bool {
			c := p.c
			return c.Username == "u" && c.Password == "s3cret" && c.TLS != nil && c.TLS.ServerName == "x"
		}},
		{URL: "etcd://u:s3cret@a?bogus=1", Err: `unknown url parameter "bogus"`},
		{URL: "etcd://a?session_ttl=-1s", Err: "session_ttl"},
		{URL: "etcd://a?cert_file=x", Err: "together"},
		{URL: "etcd://u:s3cret@a?ca_file=/nonexistent", Err: "ca_file"},
		{URL: "etcd:///x", Err: "no hosts"},
		{URL: "zk://u:s3cret@a:2379", Err: "scheme"},
	})
}

func TestOpenURL(t *testing.T) {
	queuetest.OpenURL(t, OpenURL, "etcd://"+strings.Join(shared.Endpoints(), ",")+"/openurl/?session_ttl=2s", "etcd://127.0.0.1:1?dial_timeout=300ms", nil)
}

func TestInspect(t *testing.T) {
	queuetest.Inspect(t, backend(t), "insp/%y")
}

// etcdctlCmd returns a command running the real etcdctl against the shared
// server.
func etcdctlCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	bin, err := exec.LookPath("etcdctl")
	if err != nil {
		t.Fatalf("etcdctl is not installed (Debian: etcd-client; `make deps` installs it): %v", err)
	}
	cmd := exec.Command(bin, append([]string{"--endpoints=" + strings.Join(shared.Endpoints(), ",")}, args...)...)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	return cmd
}

// etcdctlHold starts `etcdctl lock [--ttl N] NAME` and waits until it holds
// the lock (it prints its key, then waits for a signal).
func etcdctlHold(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	holder := etcdctlCmd(t, append(append([]string{"lock"}, args...), name)...)
	out, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, name+"/") {
		t.Fatalf("etcdctl lock %s said %q, %v", name, line, err)
	}
	return holder
}

// etcdctlWaiter starts `etcdctl lock NAME echo ran`: it prints "ran" once it
// holds the lock. ran reports whether it did so far; lines delivers it.
func etcdctlWaiter(t *testing.T, name string) (ran *atomic.Bool, lines <-chan string) {
	t.Helper()
	waiter := etcdctlCmd(t, "lock", name, "echo", "ran")
	wout, _ := waiter.StdoutPipe()
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = waiter.Process.Kill()
		_ = waiter.Wait()
	})
	ran = new(atomic.Bool)
	ch := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(wout)
		for sc.Scan() {
			ran.Store(true)
			ch <- sc.Text()
		}
		close(ch)
	}()
	return ran, ch
}

// expectRan waits for an etcdctlWaiter's "ran" and returns when it came.
func expectRan(t *testing.T, lines <-chan string, within time.Duration) time.Time {
	t.Helper()
	select {
	case l := <-lines:
		if l != "ran" {
			t.Fatalf("etcdctl printed %q", l)
		}
		return time.Now()
	case <-time.After(within):
		t.Fatalf("etcdctl did not get the lock within %v", within)
	}
	panic("unreachable")
}

// handOver bounds how long a waiter may take to get a lock its holder in
// another client released: a watch fires at once, so this is generous.
const handOver = time.Second

func checkHandOver(t *testing.T, what string, released, granted time.Time) {
	t.Helper()
	took := granted.Sub(released)
	t.Logf("hand-over %s: %v", what, took.Round(time.Millisecond))
	if took > handOver {
		t.Fatalf("hand-over %s took %v, want at most %v", what, took, handOver)
	}
}

// TestInteropWithEtcdctl runs the real `etcdctl lock` against dlock on the
// same name, with and without '/' in it: each excludes the other, and a
// waiter in either gets the lock within a second of the other's release.
// dlock's lock on a name's parent ("deploy" beside "deploy/prod") is not
// held back by the nested name's keys under its prefix.
func TestInteropWithEtcdctl(t *testing.T) {
	for _, tc := range []struct{ name, parent string }{{"ctl", ""}, {"deploy/prod", "deploy"}} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
			ctx := queuetest.Ctx(t, 60*time.Second)

			// etcdctl holds: dlock is refused, queues, and gets the lock
			// when etcdctl lets go.
			holder := etcdctlHold(t, tc.name)
			if _, err := d.TryAcquire(ctx, queuetest.Req(tc.name, "A")); !errors.Is(err, driver.ErrLocked) {
				t.Fatalf("dlock TryAcquire while etcdctl holds: %v, want ErrLocked", err)
			}
			if tc.parent != "" {
				pg, err := d.TryAcquire(ctx, queuetest.Req(tc.parent, "A"))
				if err != nil {
					t.Fatalf("dlock TryAcquire of %q while etcdctl holds %q: %v", tc.parent, tc.name, err)
				}
				if _, err := d.Release(ctx, queuetest.Lease(tc.parent, "A", pg)); err != nil {
					t.Fatal(err)
				}
			}
			infos, err := d.Inspect(ctx, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) != 1 || infos[0].Name != tc.name || infos[0].Token == 0 {
				t.Fatalf("Inspect while etcdctl holds: %+v, want %q held", infos, tc.name)
			}
			got := make(chan time.Time, 1)
			var g driver.Grant
			go func() {
				var err error
				g, err = d.Acquire(ctx, queuetest.Req(tc.name, "A"))
				if err != nil {
					t.Error(err)
				}
				got <- time.Now()
			}()
			queuetest.Eventually(t, 10*time.Second, "dlock queued", func() bool { return len(keys(t, d.cli, tc.name+"/")) == 2 })
			released := time.Now()
			holder.Process.Signal(os.Interrupt) // etcdctl revokes its session
			holder.Wait()
			checkHandOver(t, "etcdctl → dlock", released, <-got)

			// dlock holds: `etcdctl lock NAME echo ran` runs its command
			// only after the release.
			ran, lines := etcdctlWaiter(t, tc.name)
			queuetest.Eventually(t, 10*time.Second, "etcdctl queued", func() bool { return len(keys(t, d.cli, tc.name+"/")) == 2 })
			if ran.Load() {
				t.Fatal("etcdctl ran its command while dlock holds the lock")
			}
			released = time.Now()
			if _, err := d.Release(ctx, queuetest.Lease(tc.name, "A", g)); err != nil {
				t.Fatal(err)
			}
			checkHandOver(t, "dlock → etcdctl", released, expectRan(t, lines, 10*time.Second))
		})
	}
}

// TestEtcdctlCrash: a crashed holder's lock is freed by its own expiry rules
// both ways. An etcdctl killed while it holds loses the lock when its
// session's lease (--ttl) expires; a dlock holder killed (no release, no
// revoke) loses it when its lease does; each goes to the other's waiter.
func TestEtcdctlCrash(t *testing.T) {
	const name = "crash/ctl"
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 60*time.Second)

	holder := etcdctlHold(t, name, "--ttl=2")
	ch := make(chan driver.Grant, 1)
	go func() {
		g, err := d.Acquire(ctx, queuetest.Req(name, "A"))
		if err != nil {
			t.Error(err)
		}
		ch <- g
	}()
	queuetest.Eventually(t, 10*time.Second, "dlock queued", func() bool { return len(keys(t, d.cli, name+"/")) == 2 })
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var g driver.Grant
	select {
	case g = <-ch:
		t.Logf("killed etcdctl's lock went to dlock after %v", time.Since(killed).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("dlock did not get the lock of a killed etcdctl")
	}
	if _, err := d.Release(ctx, queuetest.Lease(name, "A", g)); err != nil {
		t.Fatal(err)
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	crashing, err := New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashing.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "B", TTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ran, lines := etcdctlWaiter(t, name)
	queuetest.Eventually(t, 10*time.Second, "etcdctl queued", func() bool { return len(keys(t, d.cli, name+"/")) == 2 })
	crashing.stop() // no more keepalives, no revoke
	cli.Close()
	killed = time.Now()
	if ran.Load() {
		t.Fatal("etcdctl ran its command while dlock holds the lock")
	}
	expectRan(t, lines, 20*time.Second)
	t.Logf("killed dlock's lock went to etcdctl after %v", time.Since(killed).Round(time.Millisecond))
}

// TestNestedNames: names are keys verbatim, so the queue prefix of "n/a"
// also holds the keys of "n/a/b" and "n/a/c"; they neither hold "n/a" nor
// count as a waiter's predecessor, before or after its own key.
func TestNestedNames(t *testing.T) {
	a := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	b := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 30*time.Second)
	if _, err := a.TryAcquire(ctx, queuetest.Req("n/a/b", "X")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, driver.AcquireRequest{Name: "n/a/b/c", Owner: "X", TTL: time.Second, LockDelay: time.Second}); err != nil {
		t.Fatal(err)
	}
	ga, err := a.TryAcquire(ctx, queuetest.Req("n/a", "A"))
	if err != nil {
		t.Fatalf("TryAcquire of n/a while n/a/b is held: %v", err)
	}
	if _, err := a.TryAcquire(ctx, queuetest.Req("n/a/c", "Y")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, queuetest.Req("n/a", "B")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire of a held n/a: %v, want ErrLocked", err)
	}
	got := make(chan driver.Grant, 1)
	go func() {
		g, err := b.Acquire(ctx, queuetest.Req("n/a", "B"))
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	queuetest.Eventually(t, 10*time.Second, "B queued", func() bool { return len(keys(t, a.cli, "n/a/")) == 2 })
	if _, err := a.Release(ctx, queuetest.Lease("n/a", "A", ga)); err != nil {
		t.Fatal(err)
	}
	var gb driver.Grant
	select {
	case gb = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("B not granted n/a after A's release, with n/a/b and n/a/c held")
	}
	if infos, err := a.Inspect(ctx, "n/"); err != nil || len(infos) != 4 {
		t.Fatalf("Inspect n/ = %+v, %v; want n/a, n/a/b, n/a/b/c and n/a/c", infos, err)
	}
	if _, err := b.Release(ctx, queuetest.Lease("n/a", "B", gb)); err != nil {
		t.Fatal(err)
	}
	// Only nested names are held: a multi-acquire's prefix compare fails,
	// and the set goes one by one.
	if _, err := b.TryAcquireMulti(ctx, []driver.AcquireRequest{queuetest.Req("n/a", "B"), queuetest.Req("n/z", "B")}); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("multi-acquire of n/a with only n/a/b held: %v, want ErrUnsupported", err)
	}
}
