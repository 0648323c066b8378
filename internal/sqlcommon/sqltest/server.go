// Package sqltest holds the test logic pglock and mysqllock share: the
// per-package server, TestMain, and the driver-level checks that do not
// depend on the database's SQL. It is imported only by those packages'
// tests.
package sqltest

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/internal/testserver"
)

// Server is one database server for a package's tests, started on first use
// (or the one the environment variable Env names) and stopped by Stop.
// It is safe for concurrent use.
type Server struct {
	Kind  string                             // the database's name, for messages
	Env   string                             // variable naming an external server's URL
	Start func() (*testserver.Server, error) // starts a private server
	// ExampleEnv, if set, names the variable the package's runnable
	// examples read their connection string from, as an application
	// would; Main sets it to ExampleValue(URL) (the URL itself when
	// ExampleValue is nil) before a run that may include examples.
	ExampleEnv   string
	ExampleValue func(url string) (string, error)

	once sync.Once
	srv  *testserver.Server
	url  string
	err  error
}

// URL returns the server's URL, starting it on the first call; it fails t
// if the server cannot be started.
func (s *Server) URL(t testing.TB) string {
	t.Helper()
	u, err := s.start()
	if err != nil {
		t.Fatalf("starting %s: %v", s.Kind, err)
	}
	return u
}

func (s *Server) start() (string, error) {
	s.once.Do(func() {
		if u := os.Getenv(s.Env); u != "" {
			s.url = u
			return
		}
		s.srv, s.err = s.Start()
		if s.err == nil {
			s.url = s.srv.URL()
		}
	})
	return s.url, s.err
}

// Private returns the server this package started, or nil when the tests
// use an external one (which they must not restart).
func (s *Server) Private(t testing.TB) *testserver.Server {
	t.Helper()
	s.URL(t)
	return s.srv
}

// Stop stops the server if this package started it.
func (s *Server) Stop() {
	if s.srv != nil {
		s.srv.Stop()
	}
}

// Main runs the tests, stops the server and then, if they passed, fails the
// run on leaked goroutines. It does not return. When the run may include
// the examples (no -run pattern, or one that mentions or matches Example),
// it starts the server first and sets s.ExampleEnv.
func Main(m *testing.M, s *Server) {
	flag.Parse()
	if s.ExampleEnv != "" && runsExamples() {
		if err := s.setExampleEnv(); err != nil {
			fmt.Fprintf(os.Stderr, "starting %s for the examples: %v\n", s.Kind, err)
			s.Stop()
			os.Exit(1)
		}
	}
	code := m.Run()
	s.Stop() // before the leak check: the server's process watchers are goroutines too
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func (s *Server) setExampleEnv() error {
	v, err := s.start()
	if err == nil && s.ExampleValue != nil {
		v, err = s.ExampleValue(v)
	}
	if err != nil {
		return err
	}
	return os.Setenv(s.ExampleEnv, v)
}

// runsExamples reports whether the -test.run pattern may select an example.
func runsExamples() bool {
	f := flag.Lookup("test.run")
	if f == nil || f.Value.String() == "" {
		return true
	}
	pat := strings.Split(f.Value.String(), "/")[0]
	re, err := regexp.Compile(pat)
	return strings.Contains(pat, "Example") || (err == nil && re.MatchString("Example"))
}

// RandomName returns prefix with a random suffix, so that tests sharing a
// server and a table never share a lock.
func RandomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// ModeURL returns base (a server URL) with the drivers' own parameters
// mode and table set, as a harness hands it to the driver's URL opener.
func ModeURL(base, mode, table string) *url.URL {
	u, _ := url.Parse(base)
	q := u.Query()
	q.Set("mode", mode)
	q.Set("table", table)
	u.RawQuery = q.Encode()
	return u
}

// Drivers records the drivers a harness opened, so that its Drop can find
// the holder of a lock among them. The zero value is ready; it is safe for
// concurrent use.
type Drivers[D any] struct {
	mu   sync.Mutex
	list []D
}

// Add records d.
func (r *Drivers[D]) Add(d D) {
	r.mu.Lock()
	r.list = append(r.list, d)
	r.mu.Unlock()
}

// All returns the drivers recorded so far, oldest first.
func (r *Drivers[D]) All() []D {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]D(nil), r.list...)
}
