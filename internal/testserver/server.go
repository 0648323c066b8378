package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ErrExternal is returned by a fault control (Kill, Restart, Pause, Resume,
// SetClockOffset) on a server that this package did not start: one named by a
// DLOCK_TEST_*_URL environment variable. When the Server belongs to a test
// (it came from Redis, Etcd, ZooKeeper, Postgres or MariaDB), the control
// skips that test instead.
var ErrExternal = errors.New("testserver: fault control on an external server (set by a DLOCK_TEST_*_URL variable)")

// ErrNotInstalled is returned (wrapped, naming the missing program) when a
// server's program is not on this machine. The functions taking a testing.TB
// skip the test instead; `make test` installs everything, and with CI=true a
// skipped backend test fails the run.
var ErrNotInstalled = errors.New("testserver: server program not installed (run `make test`, or scripts/install-deps.sh)")

// ErrNoFaketime is returned by SetClockOffset on a server that was not started
// with Faketime set.
var ErrNoFaketime = errors.New("testserver: server was not started under libfaketime")

// Server is one server process started by this package, or an external
// server named by an environment variable. All methods are safe for
// concurrent use. Fault controls act on the server's whole process tree, so
// servers that fork (PostgreSQL backends) are killed, paused and resumed as a
// unit.
type Server struct {
	kind string
	tb   testing.TB // set by the testing.TB constructors; used to skip on external servers

	external bool
	addr     string
	url      string
	dsn      string

	// Set by the kind-specific constructor; immutable after start.
	dir      string                          // temporary directory, removed by Stop
	port     int                             // client port, kept across restarts
	dataDir  string                          // removed by Restart(true)
	initData func() error                    // creates dataDir's contents from nothing
	wiped    func() error                    // optional, run after a wipe's initData (etcd rejoins its cluster)
	command  func() *exec.Cmd                // builds the server command line
	ready    func(ctx context.Context) error // one real request; nil error means it answers
	after    func(ctx context.Context) error // optional, run once it answers (create databases)
	cleanup  func()                          // optional, frees what a dead server left outside dir (before a wipe, at Stop)
	stopSig  syscall.Signal                  // polite stop signal (default SIGTERM)
	stopWait time.Duration                   // grace before SIGKILL (default defaultStopGrace)
	cred     *syscall.Credential             // run as this user when set
	faketime string                          // timestamp file, "" without faketime
	preload  []string                        // preloaded after libfaketime (see faketimeEnv)
	logPath  string

	mu      sync.Mutex
	proc    *process
	stopped bool
	alive   atomic.Bool // proc != nil; read without mu so members can ask each other
}

type process struct {
	cmd  *exec.Cmd
	pgid int
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result, valid after done
}

// Addr returns the server's client address, "127.0.0.1:port".
func (s *Server) Addr() string { return s.addr }

// URL returns the address in the form the kind's dlock driver and client
// library take (see the package documentation).
func (s *Server) URL() string { return s.url }

// DSN returns the go-sql-driver/mysql data source name for a MariaDB server,
// "root@tcp(127.0.0.1:port)/dlock?parseTime=true"; "" for other kinds.
func (s *Server) DSN() string { return s.dsn }

// External reports whether the server was named by a DLOCK_TEST_*_URL
// variable rather than started by this package. Fault controls do not work on
// external servers.
func (s *Server) External() bool { return s.external }

// Dir returns the server's temporary directory ("" for external servers). Its
// log is server.log there.
func (s *Server) Dir() string { return s.dir }

// Running reports whether the server process is alive (stopped by Pause
// counts as alive). External servers always report true.
func (s *Server) Running() bool {
	if s.external {
		return true
	}
	return s.alive.Load()
}

// baseDir is where temporary directories go: $DLOCK_TEST_TMPDIR, else
// /dev/shm when it is a roomy tmpfs (fsync is free there, which matters for
// etcd and ZooKeeper), else the system temporary directory.
func baseDir() string {
	if d := os.Getenv("DLOCK_TEST_TMPDIR"); d != "" {
		return d
	}
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && st.Bavail*uint64(st.Bsize) > 2<<30 {
		if f, err := os.CreateTemp("/dev/shm", "dlock-probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}

// newServer creates the temporary directory and the parts every kind shares.
func newServer(kind string) (*Server, error) {
	dir, err := os.MkdirTemp(baseDir(), "dlock-"+kind+"-")
	if err != nil {
		return nil, fmt.Errorf("testserver: %s: %w", kind, err)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Server{
		kind:    kind,
		dir:     dir,
		port:    port,
		addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "server.log"),
	}, nil
}

// launch creates the data and starts a new server; on failure it removes
// everything.
func (s *Server) launch() error {
	if err := s.initData(); err != nil {
		os.RemoveAll(s.dir)
		return fmt.Errorf("testserver: %s: %w", s.kind, err)
	}
	s.mu.Lock()
	err := s.startLocked()
	s.mu.Unlock()
	if err != nil {
		os.RemoveAll(s.dir)
	}
	return err
}

// lookPath finds a program in PATH or in the given fallback locations, which
// matter when PATH lacks /usr/sbin.
func lookPath(name string, fallbacks ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, f := range fallbacks {
		if st, err := os.Stat(f); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrNotInstalled, name)
}

// external builds a Server for an address taken from an environment variable.
func externalServer(kind, rawURL string) (*Server, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("testserver: %s: the URL in the environment does not parse", kind)
	}
	host := u.Host
	if host == "" {
		return nil, fmt.Errorf("testserver: %s: the URL in the environment has no host", kind)
	}
	return &Server{kind: kind, external: true, addr: host, url: rawURL}, nil
}

// forTest turns a Start* result into the testing.TB form: a missing program
// skips the test, any other error fails it, and the server stops at cleanup.
func forTest(t testing.TB, s *Server, err error) *Server {
	t.Helper()
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	s.tb = t
	t.Cleanup(s.Stop)
	return s
}
