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

// TestInteropWithEtcdctl runs the real `etcdctl lock` against dlock on the
// same name.
func TestInteropWithEtcdctl(t *testing.T) {
	bin, err := exec.LookPath("etcdctl")
	if err != nil {
		t.Skip("etcdctl not installed")
	}
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 60*time.Second)
	etcdctl := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, append([]string{"--endpoints=" + strings.Join(shared.Endpoints(), ",")}, args...)...)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		return cmd
	}

	// etcdctl holds (it prints its key, then waits for a signal).
	holder := etcdctl("lock", "ctl")
	out, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ctl/") {
		t.Fatalf("etcdctl lock said %q, %v", line, err)
	}
	if _, err := d.TryAcquire(ctx, queuetest.Req("ctl", "A")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("dlock TryAcquire while etcdctl holds: %v, want ErrLocked", err)
	}
	holder.Process.Signal(os.Interrupt) // etcdctl revokes its session
	holder.Wait()
	g, err := d.Acquire(ctx, queuetest.Req("ctl", "A"))
	if err != nil {
		t.Fatal(err)
	}

	// dlock holds: `etcdctl lock ctl echo` runs its command only after the
	// release.
	var ran atomic.Bool
	waiter := etcdctl("lock", "ctl", "echo", "ran")
	wout, _ := waiter.StdoutPipe()
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	defer waiter.Process.Kill()
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(wout)
		for sc.Scan() {
			ran.Store(true)
			lines <- sc.Text()
		}
		close(lines)
	}()
	queuetest.Eventually(t, 10*time.Second, "etcdctl queued", func() bool { return len(keys(t, d.cli, "ctl/")) == 2 })
	if ran.Load() {
		t.Fatal("etcdctl ran its command while dlock holds the lock")
	}
	if _, err := d.Release(ctx, queuetest.Lease("ctl", "A", g)); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-lines:
		if l != "ran" {
			t.Fatalf("etcdctl printed %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("etcdctl did not get the lock after dlock released it")
	}
	waiter.Wait()
}
