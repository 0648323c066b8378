package main

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/testserver"
)

// TestProcessEtcdStopsAnswering: etcd is paused while CMD runs under a 2s
// lease; the lease is lost, CMD is stopped, and dlock exits 76 promptly
// once CMD is gone, saying what happened, rather than waiting for the
// unanswering backend to close.
func TestProcessEtcdStopsAnswering(t *testing.T) {
	c := testserver.Etcd(t, 1)
	dir := t.TempDir()
	ready, gone := filepath.Join(dir, "ready"), filepath.Join(dir, "gone")
	cmd, out := startDlock(t, c.URL()+"/stall/", "run", "--ttl", "2s", "--kill-grace", "1s", "job", "--", "sh", "-c",
		`trap 'touch "$1"; exit 143' TERM; touch "$0"; while :; do sleep 0.05; done`, ready, gone)
	waitFor(t, "CMD to start", 20*time.Second, fileExists(ready))
	if err := c.Members[0].Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Members[0].Resume() })
	waitFor(t, "CMD to be stopped", 20*time.Second, fileExists(gone))
	stopped := time.Now()
	code := waitExit(t, cmd, 20*time.Second)
	if code != exitLeaseLost {
		t.Fatalf("exit %d, want 76; output %s", code, out)
	}
	if el := time.Since(stopped); el > 3500*time.Millisecond { // before the fix: 5s (etcd's close timeout)
		t.Errorf("dlock exited %v after CMD was stopped, want at once; output %s", el, out)
	}
	if s := out.String(); !strings.Contains(s, `lease lost on "job"`) || !strings.Contains(s, "backend is not answering") {
		t.Errorf("output %q does not say the lease was lost and the backend is not answering", s)
	}
}

// backendURLs starts one server of each network backend (and an SQLite
// file) and returns their dlock URLs by name.
func backendURLs(t *testing.T) map[string]string {
	t.Helper()
	sq, _ := sqliteTestURL(t)
	rs := testserver.RedisN(t, 3, nil)
	var nodes []string
	for _, s := range rs {
		nodes = append(nodes, s.Addr())
	}
	return map[string]string{
		"sqlite":   sq,
		"redis":    testserver.Redis(t, nil).URL(),
		"redlock":  "redlock://" + strings.Join(nodes, ","),
		"etcd":     testserver.Etcd(t, 1).URL() + "/dlock/",
		"zk":       testserver.ZooKeeper(t, 1).URL() + "/dlock",
		"postgres": testserver.Postgres(t).URL(),
		"mysql":    testserver.MariaDB(t).URL(),
	}
}

// statusJSON runs "dlock status --json PREFIX" and returns the entry for
// name (ok false when it is not listed).
func statusJSON(t *testing.T, rawURL, name string) (lockJSON, bool) {
	t.Helper()
	te := newTestEnv(nil)
	if code := te.run("status", "--url", rawURL, "--json", name); code != 0 {
		t.Fatalf("status: exit %d: %s", code, te.stderr.String())
	}
	var all []lockJSON
	if err := json.Unmarshal([]byte(te.stdout.String()), &all); err != nil {
		t.Fatalf("status --json: %v\n%s", err, te.stdout.String())
	}
	for _, j := range all {
		if j.Name == name && j.Type == "mutex" {
			return j, true
		}
	}
	return lockJSON{}, false
}

// TestStatusEveryBackend: the same columns mean the same on every backend:
// a held lock shows its owner, token and hold count, a time left within its
// TTL or null where the backend cannot tell (session-bound), waiters or
// null; a released lock shows no owner, a zero time left, and its last
// token where the backend keeps a record of it. release --force refuses a
// wrong token and frees it with the right one on every backend, and the
// holder learns that its lease is gone.
func TestStatusEveryBackend(t *testing.T) {
	urls := backendURLs(t)
	for _, be := range []string{"sqlite", "redis", "redlock", "etcd", "zk", "postgres", "mysql"} {
		t.Run(be, func(t *testing.T) {
			u := urls[be]
			c := openClient(t, u)
			ctx := context.Background()
			l, err := c.NewMutex("st/a", &dlock.MutexOptions{TTL: 30 * time.Second}).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			j, ok := statusJSON(t, u, "st/a")
			if !ok || j.Owner != l.Owner() || j.Token != l.Token() || j.Count != 1 {
				t.Errorf("held: %+v (ok %v), want owner %s token %d count 1", j, ok, l.Owner(), l.Token())
			}
			if j.ExpiresInMS != nil && (*j.ExpiresInMS <= 0 || *j.ExpiresInMS > 30000) {
				t.Errorf("held: expires_in_ms %d, want within the 30s TTL or null", *j.ExpiresInMS)
			}
			if j.Waiters != nil && *j.Waiters != 0 {
				t.Errorf("held: waiters %d, want 0 or null", *j.Waiters)
			}

			te := newTestEnv(nil)
			if code := te.run("release", "--force", "--url", u, "st/a", "--token", itoa(l.Token()+1)); code != exitNothingReleased {
				t.Fatalf("release --force with a wrong token: exit %d: %s", code, te.stderr.String())
			}
			te = newTestEnv(nil)
			code := te.run("release", "--force", "--url", u, "st/a", "--token", itoa(l.Token()))
			if code != 0 {
				t.Fatalf("release --force: exit %d: %s", code, te.stderr.String())
			}
			waitFor(t, "the holder to learn its lease is gone", 20*time.Second, func() bool {
				return l.Extend(ctx, 30*time.Second) != nil
			})
			j, ok = statusJSON(t, u, "st/a")
			if ok && (j.Owner != "" || j.Count != 0 || j.ExpiresInMS == nil || *j.ExpiresInMS != 0 || (j.Token != 0 && j.Token != l.Token())) {
				t.Errorf("released: %+v, want no owner, count 0, expires_in_ms 0, token %d or 0", j, l.Token())
			}
			t.Logf("%s: release --force exit %d; after release listed %v token %d", be, code, ok, j.Token)
		})
	}
}

// kazooHold is a Python kazoo client that takes a lock with kazoo's
// defaults (no identifier, so its node holds no data), says "held", and
// keeps it until its stdin closes.
const kazooHold = `
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1])
zk.start()
lock = zk.Lock(sys.argv[2])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
zk.stop()
`

// startForeign starts a foreign client's command that prints marker once
// it holds the lock, and returns once it has; closing stdin (or killing it)
// ends it at cleanup.
func startForeign(t *testing.T, marker string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	waitFor(t, name+" to hold the lock", 30*time.Second, func() bool { return strings.Contains(out.String(), marker) })
}

// TestStatusForeignHolders: a lock held by another client library (etcdctl
// lock, Python kazoo), which stores no dlock owner, shows as held, with a
// stand-in owner naming the holder's session, its token and no expiry; wait
// does not call it free; release --force with its token frees it.
func TestStatusForeignHolders(t *testing.T) {
	etcd := testserver.Etcd(t, 1)
	zk := testserver.ZooKeeper(t, 1)
	for _, tc := range []struct {
		name, url, owner string
		start            func(t *testing.T)
	}{
		{"etcdctl", etcd.URL() + "/dlock/", "etcd-lease:", func(t *testing.T) {
			startForeign(t, "dlock/st/held", "etcdctl", "--endpoints="+etcd.Endpoints()[0], "lock", "dlock/st/held")
		}},
		{"kazoo", zk.URL() + "/dlock", "zk-session:", func(t *testing.T) {
			startForeign(t, "held", "/usr/bin/python3", "-c", kazooHold, zk.Endpoints()[0], "/dlock/st/held")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.start(t)
			j, ok := statusJSON(t, tc.url, "st/held")
			if !ok || !strings.HasPrefix(j.Owner, tc.owner) || j.Token == 0 || j.Count != 1 || j.ExpiresInMS != nil {
				t.Errorf("status of a lock %s holds: %+v (listed %v), want owner %s…, a token, count 1, expires_in_ms null", tc.name, j, ok, tc.owner)
			}
			te := newTestEnv(nil)
			if code := te.run("wait", "--url", tc.url, "--wait", "0", "st/held"); code != exitNotAcquired {
				t.Errorf("wait on a lock %s holds: exit %d, %s", tc.name, code, te.stderr.String())
			}
			if _, err := openClient(t, tc.url).NewMutex("st/held", nil).TryLock(context.Background()); !errors.Is(err, dlock.ErrLocked) {
				t.Errorf("TryLock of a lock %s holds: %v, want ErrLocked", tc.name, err)
			}
			// Break-glass: the foreign holder's grant is removed by its token.
			te = newTestEnv(nil)
			if code := te.run("release", "--force", "--url", tc.url, "st/held", "--token", itoa(j.Token)); code != 0 {
				t.Fatalf("release --force of %s's lock: exit %d: %s", tc.name, code, te.stderr.String())
			}
			if _, err := openClient(t, tc.url).NewMutex("st/held", nil).TryLock(context.Background()); err != nil {
				t.Errorf("TryLock after release --force of %s's lock: %v", tc.name, err)
			}
		})
	}
}

// TestRunKeyVariable: CMD gets DLOCK_KEY, where the backend keeps the
// grant, on the backends that name one: the etcd key (as etcdctl lock
// prints it), the ZooKeeper node, the Redis key; and DLOCK_TTL as granted.
func TestRunKeyVariable(t *testing.T) {
	urls := backendURLs(t)
	for _, tc := range []struct{ be, want string }{
		{"etcd", `^dlock/k/[0-9a-f]+(-[0-9a-f]{1,16})?$`},
		{"zk", `^/dlock/k/.*(__lock__|lock-)\d{10}$`},
		{"redis", `^dlock:\{k\}$`},
		{"redlock", `^dlock:\{k\}$`},
		{"sqlite", `^dlock_locks/k$`},
	} {
		t.Run(tc.be, func(t *testing.T) {
			te := newTestEnv(map[string]string{"DLOCK_KEY": "stale"})
			if code := te.run("run", "--url", urls[tc.be], "--ttl", "3s", "k", "--", "sh", "-c", `echo "$DLOCK_KEY"; echo "$DLOCK_TTL"`); code != 0 {
				t.Fatalf("exit %d: %s", code, te.stderr.String())
			}
			key, ttl, _ := strings.Cut(strings.TrimSpace(te.stdout.String()), "\n")
			if !regexp.MustCompile(tc.want).MatchString(key) || key == "stale" {
				t.Errorf("DLOCK_KEY %q, want %s", key, tc.want)
			}
			if testing.Verbose() {
				t.Logf("DLOCK_KEY=%s", key)
			}
			if ttl != "3" {
				t.Errorf("DLOCK_TTL %q, want 3", ttl)
			}
		})
	}
}

// TestStatusLockDelay: EXPIRES-IN is how long until the lock can be taken
// if its holder neither renews nor releases it: the lease left plus the
// lock-delay, on every backend with lock-delay; and a holder that vanished
// (its lease expired unreleased) still shows as held while its lock-delay
// keeps others out, so that wait does not call it free.
func TestStatusLockDelay(t *testing.T) {
	urls := backendURLs(t)
	for _, be := range []string{"sqlite", "redis", "postgres", "mysql"} {
		t.Run(be, func(t *testing.T) {
			u := urls[be]
			c := openClient(t, u)
			ctx := context.Background()
			// No renewal: the lease runs out after its TTL.
			opts := &dlock.MutexOptions{TTL: 2 * time.Second, LockDelay: 4 * time.Second, RenewInterval: -1}
			l, err := c.NewMutex("ld/a", opts).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			j, ok := statusJSON(t, u, "ld/a")
			if !ok || j.Owner != l.Owner() || j.ExpiresInMS == nil || *j.ExpiresInMS <= 2000 || *j.ExpiresInMS > 6000 {
				t.Fatalf("held: %+v, want expires_in_ms in (2000, 6000]: the lease plus the lock-delay", j)
			}
			waitFor(t, "the lease to run out", 20*time.Second, func() bool { return l.ValidFor() <= 0 })
			waitFor(t, "the server to expire the lease", 20*time.Second, func() bool {
				_, err := openClient(t, u).NewMutex("ld/a", nil).TryLock(ctx)
				var le interface{ Unwrap() error }
				_ = le
				return errors.Is(err, dlock.ErrLocked) && func() bool {
					j, _ := statusJSON(t, u, "ld/a")
					return j.ExpiresInMS != nil && *j.ExpiresInMS <= 4000
				}()
			})
			j, ok = statusJSON(t, u, "ld/a")
			if !ok || j.Owner == "" || j.ExpiresInMS == nil || *j.ExpiresInMS <= 0 {
				t.Errorf("in its lock-delay: %+v, want still held with the delay's time left", j)
			}
			te := newTestEnv(nil)
			if code := te.run("wait", "--url", u, "--wait", "0", "ld/a"); code != exitNotAcquired {
				t.Errorf("wait in the lock-delay: exit %d, want 75", code)
			}
		})
	}
}
