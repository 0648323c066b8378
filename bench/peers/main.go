// Command peers compares dlock with the lock libraries people use instead of
// it, and with each backend's raw floor, on the same servers in one process:
// redsync and bsm/redislock on Redis, redsync on Redlock, etcd's
// concurrency.Mutex, go-zookeeper's zk.Lock, and hand-written blocking
// pg_advisory_lock and GET_LOCK. Contenders of a backend run interleaved
// (every round runs each once, in an order shuffled each round), so drift
// on a noisy machine hits them all alike and none always runs right after
// the same other one; read the ratios.
//
// It is its own Go module, so that the peers never become dependencies of
// dlock. It takes the servers' URLs as flags; `make bench-peers` (the
// bench/run launcher in the main module) starts throwaway servers and runs
// it. Scenarios:
//
//   - uncontended Lock+Unlock, p50 and p99;
//   - hot lock: 8 goroutines (each with a client of its own) on one lock:
//     hand-off p50/p99 (release → next grant), throughput, and how often the
//     previous holder took the lock again;
//   - wake-up: release → grant of one blocked waiter;
//   - many held: Lock+Unlock of an unrelated name while the same client
//     holds N leases (0 … 10,000), the time to take them, heap per lease.
//
// It writes results.md and SVG plots (hand-off latency distribution and cost
// against leases held, per backend) into -out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// serverURLs are the servers to compare on; an empty one is skipped.
type serverURLs struct {
	redis, redlock, etcd, zk, postgres, mysql, sqlite string
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	var urls serverURLs
	fs.StringVar(&urls.redis, "redis", "", "redis:// URL of one server")
	fs.StringVar(&urls.redlock, "redlock", "", "redlock://h1,h2,h3 URL of independent servers")
	fs.StringVar(&urls.etcd, "etcd", "", "etcd:// URL")
	fs.StringVar(&urls.zk, "zk", "", "zk:// URL")
	fs.StringVar(&urls.postgres, "postgres", "", "postgres:// URL (mode is set per contender)")
	fs.StringVar(&urls.mysql, "mysql", "", "mysql:// URL (mode is set per contender)")
	fs.StringVar(&urls.sqlite, "sqlite", "", "sqlite:// URL of a file")
	out := fs.String("out", ".", "directory for results.md and the SVG plots")
	scale := fs.Float64("scale", 1, "multiplies every scenario's duration (0.2 for a quick look)")
	held := fs.String("held", "0,1000,3000,10000", "leases held at each level of the many-held scenario")
	note := fs.String("note", "", "a line for the header of results.md (e.g. the commit measured)")
	if err := fs.Parse(args); err != nil {
		return 64
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "peers: unexpected arguments %q\n", fs.Args())
		return 64
	}
	if *scale <= 0 {
		fmt.Fprintln(os.Stderr, "peers: -scale must be positive")
		return 64
	}
	var levels []int
	for _, f := range strings.Split(*held, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || (len(levels) > 0 && n <= levels[len(levels)-1]) {
			fmt.Fprintf(os.Stderr, "peers: -held %q: want ascending counts ≥ 0\n", *held)
			return 64
		}
		levels = append(levels, n)
	}
	bs, err := backends(urls)
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		return 64
	}
	if len(bs) == 0 {
		fmt.Fprintln(os.Stderr, "peers: no server given (-redis, -redlock, -etcd, -zk, -postgres, -mysql, -sqlite)")
		return 64
	}
	d := func(base time.Duration) time.Duration { return time.Duration(float64(base) * *scale) }
	cfg := &config{
		uncontended: d(6 * time.Second),
		hotRounds:   3,
		hotSlice:    d(2 * time.Second),
		goroutines:  8,
		wake:        d(5 * time.Second),
		held:        levels,
		heldProbe:   d(2 * time.Second),
		opTimeout:   30 * time.Second,
		runID:       "peers" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36),
		progress: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "%s peers: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
		},
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var results []*result
	for _, b := range bs {
		results = append(results, runBackend(ctx, cfg, b))
		if ctx.Err() != nil {
			break
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		return 1
	}
	header := fmt.Sprintf("Measured %s on %d CPUs (%s/%s, %s)%s. Times in µs; "+
		"Lock+Unlock interleaved for %v per backend, hot lock %d×%v per contender, wake-up for %v.\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(),
		noteText(*note), cfg.uncontended, cfg.hotRounds, cfg.hotSlice, cfg.wake)
	f, err := os.Create(filepath.Join(*out, "results.md"))
	if err == nil {
		err = writeMarkdown(f, header, results, cfg)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers: results.md: %v\n", err)
		return 1
	}
	files, err := writePlots(*out, results)
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers: plots: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "peers: wrote %s and %d plots\n", filepath.Join(*out, "results.md"), len(files))
	return 0
}

func noteText(n string) string {
	if n == "" {
		return ""
	}
	return ", " + n
}
