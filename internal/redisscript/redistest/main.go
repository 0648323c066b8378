package redistest

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/internal/testserver"
)

// Environment variables Main sets for the runnable examples, which read
// their servers from the environment as an application would.
const (
	// EnvURL is the redis:// URL of the first server.
	EnvURL = "REDIS_URL"
	// EnvAddrs is the host:port of every server, comma-separated.
	EnvAddrs = "REDIS_ADDRS"
)

// Main is a Redis driver package's TestMain. It starts n redis-servers for
// the package's runnable examples (or uses the first n of
// DLOCK_TEST_REDIS_URL, when that lists enough) and sets EnvURL and EnvAddrs
// to them, runs the tests, stops the servers and then, if the tests passed,
// fails the run on leaked goroutines. The tests themselves start their own
// servers through internal/testserver. Main does not return; it exits 1 with
// a message when the servers cannot be started.
func Main(m *testing.M, n int) {
	urls, stop, err := exampleServers(n)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting redis-server for the examples: %v\n", err)
		os.Exit(1)
	}
	addrs := make([]string, len(urls))
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			stop()
			fmt.Fprintf(os.Stderr, "redis server %d: the URL does not parse\n", i)
			os.Exit(1)
		}
		addrs[i] = u.Host
	}
	os.Setenv(EnvURL, urls[0])
	os.Setenv(EnvAddrs, strings.Join(addrs, ","))
	code := m.Run()
	stop() // before the leak check: the servers' process watchers are goroutines too
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// exampleServers returns the URLs of n servers and a function that stops
// the ones it started.
func exampleServers(n int) ([]string, func(), error) {
	var ext []string
	for _, u := range strings.Split(os.Getenv("DLOCK_TEST_REDIS_URL"), ",") {
		if u = strings.TrimSpace(u); u != "" {
			ext = append(ext, u)
		}
	}
	if len(ext) >= n {
		return ext[:n], func() {}, nil
	}
	var srvs []*testserver.Server
	stop := func() {
		for _, s := range srvs {
			s.Stop()
		}
	}
	var urls []string
	for range n {
		s, err := testserver.StartRedis(nil)
		if err != nil {
			stop()
			return nil, nil, err
		}
		srvs = append(srvs, s)
		urls = append(urls, s.URL())
	}
	return urls, stop, nil
}
