package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/dlock/dlock/memlock"
	"go.uber.org/goleak"
)

// binDir holds the dlock binary the process tests build (once, on first
// use) and run.
var (
	binDir    string
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlock-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: leaked goroutines:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// dlockBinary builds cmd/dlock once per test run and returns its path.
func dlockBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	buildOnce.Do(func() {
		binPath = filepath.Join(binDir, "dlock")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func init() {
	// A backend that cannot list locks, for status's ErrUnsupported path.
	dlock.Register("test-noinspect", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return plainDriver{memlock.Named("noinspect" + u.Host).NewDriver()}, nil
	})
	// A backend that refuses its URL as drivers do, through openurl.
	dlock.Register("test-badurl", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return nil, openurl.BadURL("test-badurl: unknown URL parameter %q", "bogus")
	})
	// A backend whose open error echoes the whole URL, password included,
	// as careless client libraries do.
	dlock.Register("test-leaky", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return nil, fmt.Errorf("cannot log in to %s", u.String())
	})
}

// plainDriver hides every optional capability of the driver it wraps.
type plainDriver struct{ driver.Driver }

// syncBuffer is a bytes.Buffer safe for a child's output copier and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testEnv runs dlock in-process with its own streams, variables and a
// signal channel the test feeds.
type testEnv struct {
	stdout, stderr syncBuffer
	vars           map[string]string
	sigs           chan os.Signal
	notified       atomic.Int32 // times notify was called
}

func newTestEnv(vars map[string]string) *testEnv {
	if vars == nil {
		vars = map[string]string{}
	}
	return &testEnv{vars: vars, sigs: make(chan os.Signal, 4)}
}

func (te *testEnv) env() *env {
	return &env{
		stdout: &te.stdout,
		stderr: &te.stderr,
		lookupEnv: func(k string) (string, bool) {
			v, ok := te.vars[k]
			return v, ok
		},
		environ: func() []string {
			out := os.Environ()
			for k, v := range te.vars {
				out = append(out, k+"="+v)
			}
			return out
		},
		notify: func() (<-chan os.Signal, func()) {
			te.notified.Add(1)
			return te.sigs, func() {}
		},
	}
}

func (te *testEnv) run(args ...string) int {
	return run(args, te.env())
}

var memSeq atomic.Int64

// memURL returns a fresh mem:// URL and the backend behind it.
func memURL() (string, *memlock.Backend) {
	name := fmt.Sprintf("clitest%d", memSeq.Add(1))
	return "mem://" + name, memlock.Named(name)
}

// sqliteTestURL returns a sqlite URL for a new file in a fresh directory
// whose name has a space in it.
func sqliteTestURL(t *testing.T) (string, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state dir")
	path := filepath.Join(dir, "locks.db")
	return sqliteURL(path), path
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	testwait.Until(t, d, what, cond)
}

func fileExists(path string) func() bool {
	return func() bool {
		_, err := os.Stat(path)
		return err == nil
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// openClient opens rawURL for the test; the client closes at the end.
func openClient(t *testing.T, rawURL string) *dlock.Client {
	t.Helper()
	c, err := dlock.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// holdLock takes name on rawURL from the test itself and returns the lease;
// the client closes at the end of the test.
func holdLock(t *testing.T, rawURL, name string, opts *dlock.MutexOptions) *dlock.Lease {
	t.Helper()
	l, err := openClient(t, rawURL).NewMutex(name, opts).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l
}
