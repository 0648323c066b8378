package testserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/internal/testserver"
)

// zkConn connects with a short session timeout and a silent logger.
func zkConn(t *testing.T, servers []string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect(servers, 2*time.Second, zk.WithLogInfo(false), zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// zkCreate retries a create until the server answers (after a restart the
// client reconnects on its own).
func zkCreate(ctx context.Context, c *zk.Conn, path string) error {
	return waitFor(ctx, func() error {
		_, err := c.Create(path, []byte("x"), 0, zk.WorldACL(zk.PermAll))
		if errors.Is(err, zk.ErrNodeExists) {
			return nil
		}
		return err
	})
}

func zkExists(ctx context.Context, c *zk.Conn, path string) (bool, error) {
	var ok bool
	err := waitFor(ctx, func() error {
		var err error
		ok, _, err = c.Exists(path)
		return err
	})
	return ok, err
}

func ruok(addr string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "ruok"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestZooKeeperStandalone(t *testing.T) {
	t.Parallel()
	start := time.Now()
	z := testserver.ZooKeeper(t, 1)
	t.Logf("zookeeper (standalone) started in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if got, err := ruok(z.Endpoints()[0], 5*time.Second); err != nil || got != "imok" {
		t.Fatalf("ruok = %q, %v", got, err)
	}
	if !strings.HasPrefix(z.URL(), "zk://127.0.0.1:") {
		t.Fatalf("URL() = %q", z.URL())
	}
	if i, err := z.Leader(); err != nil || i != 0 {
		t.Fatalf("Leader() = %d, %v; want 0", i, err)
	}
	c := zkConn(t, z.Endpoints())
	if err := zkCreate(ctx, c, "/persistent"); err != nil {
		t.Fatal(err)
	}
	m := z.Members[0]
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(false); err != nil {
		t.Fatal(err)
	}
	if ok, err := zkExists(ctx, c, "/persistent"); err != nil || !ok {
		t.Fatalf("/persistent after kill+restart: exists=%v err=%v", ok, err)
	}

	// A paused server accepts connections (the kernel does) but answers
	// nothing.
	if err := m.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := ruok(m.Addr(), 300*time.Millisecond); err == nil {
		t.Fatal("a paused server answered ruok")
	}
	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}

	if err := m.Restart(true); err != nil {
		t.Fatal(err)
	}
	c2 := zkConn(t, z.Endpoints())
	if ok, err := zkExists(ctx, c2, "/persistent"); err != nil || ok {
		t.Fatalf("/persistent after a wiped restart: exists=%v err=%v; want gone", ok, err)
	}
}

func TestZooKeeperEnsemble(t *testing.T) {
	t.Parallel()
	start := time.Now()
	z := testserver.ZooKeeper(t, 3)
	t.Logf("zookeeper (3 nodes) started in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := zkConn(t, z.Endpoints())
	if err := zkCreate(ctx, c, "/a"); err != nil {
		t.Fatal(err)
	}
	leader, err := z.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := z.Members[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, func() error {
		l, err := z.Leader()
		if err != nil {
			return err
		}
		if l == leader {
			return fmt.Errorf("killed server %d still leader", l)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := zkCreate(ctx, c, "/b"); err != nil {
		t.Fatal(err)
	}
	if err := z.Members[leader].Restart(false); err != nil {
		t.Fatal(err)
	}
	// The restarted server alone sees everything, including what was written
	// while it was down.
	one := zkConn(t, []string{z.Members[leader].Addr()})
	for _, p := range []string{"/a", "/b"} {
		if ok, err := zkExists(ctx, one, p); err != nil || !ok {
			t.Fatalf("%s on the restarted server: exists=%v err=%v", p, ok, err)
		}
	}
	// A wiped follower rejoins and is refilled from the leader.
	leader, err = z.Leader()
	if err != nil {
		t.Fatal(err)
	}
	f := (leader + 1) % 3
	if err := z.Members[f].Restart(true); err != nil {
		t.Fatal(err)
	}
	wiped := zkConn(t, []string{z.Members[f].Addr()})
	if ok, err := zkExists(ctx, wiped, "/b"); err != nil || !ok {
		t.Fatalf("/b on the wiped and restarted server: exists=%v err=%v", ok, err)
	}
}

func TestZooKeeperFaketime(t *testing.T) {
	t.Parallel()
	start := time.Now()
	z := testserver.ZooKeeperWith(t, 1, &testserver.ZooKeeperOptions{Faketime: true})
	t.Logf("zookeeper (standalone, faketime) started in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, events, err := zk.Connect(z.Endpoints(), 2*time.Second, zk.WithLogInfo(false), zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A node's mtime is the server's wall clock.
	mtime := func(path string) time.Time {
		t.Helper()
		if err := zkCreate(ctx, c, path); err != nil {
			t.Fatal(err)
		}
		_, st, err := c.Get(path)
		if err != nil {
			t.Fatal(err)
		}
		return time.UnixMilli(st.Mtime)
	}
	before := mtime("/before")
	if err := z.Members[0].SetClockOffset(24 * time.Hour); err != nil {
		t.Fatal(err)
	}
	after := mtime("/after")
	if jump := after.Sub(before); jump < 24*time.Hour-time.Minute || jump > 24*time.Hour+time.Minute {
		t.Fatalf("server clock moved by %v after SetClockOffset(24h)", jump)
	}
	// The session survives: ZooKeeper expires sessions on its monotonic
	// clock, which libfaketime leaves alone. Watch the session for the
	// session timeout (2s, ten server ticks) after the jump.
	window := time.NewTimer(2 * time.Second)
	defer window.Stop()
	for watching := true; watching; {
		select {
		case ev := <-events:
			if ev.State == zk.StateExpired {
				t.Fatal("the session expired after a wall-clock jump")
			}
		case <-window.C:
			watching = false
		}
	}
	if _, _, err := c.Get("/after"); err != nil {
		t.Fatalf("session after the clock jump: %v", err)
	}
}
