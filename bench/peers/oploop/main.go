// Command oploop runs uncontended Lock+Unlock in a loop and nothing else,
// so that what one op costs can be counted from outside: system calls
// (`perf stat -e 'syscalls:sys_enter_*'`, `strace -f -c`), a CPU profile
// (-cpuprofile), and the process's and the nodes' CPU per op, which it
// prints itself (the nodes' from INFO cpu).
//
//	oploop -peer dlock -nodes 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 -n 4000
//	perf stat -e raw_syscalls:sys_enter oploop -peer redsync -nodes ... -n 4000
//	oploop -peer dlock,redsync -nodes ... -n 4000
//	oploop -peer redis-dlock -nodes 127.0.0.1:7001 -n 20000
//
// With several peers (comma-separated: dlock, redsync, floor for Redlock on
// every node; redis-dlock, bsm, redis-floor for plain Redis on the first
// node) their ops are
// interleaved as in the peer harness (one op of each per round, the first
// rotating), and the CPU figures are those of all of them together. Setup (connections, script
// loads) is outside the loop but inside a trace: run it with two values of
// -n and take the difference per op.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/bench/floor"
	"github.com/dlock/dlock/internal/redisinfo"
	"github.com/dlock/dlock/locktest"
	_ "github.com/dlock/dlock/redislock"
	_ "github.com/dlock/dlock/redlock"
)

func main() {
	peers := flag.String("peer", "dlock", "dlock, redsync or floor (SET NX PX + DEL on every node); redis-dlock, bsm or redis-floor (one node, the first); or several comma-separated (interleaved)")
	nodes := flag.String("nodes", "", "host:port of each Redis master, comma-separated")
	query := flag.String("query", "", "query of dlock's redlock:// URL")
	n := flag.Int("n", 2000, "Lock+Unlock ops counted (of each peer)")
	warm := flag.Int("warm", 50, "Lock+Unlock ops run before the counted ones (of each peer)")
	opTimeout := flag.Duration("op-timeout", time.Minute, "each op's context.WithTimeout, as the peer harness gives it (0: context.Background)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the counted loop to this file (with -hot: of each peer's hot lock, to the file's name after the peer's and a dash)")
	hot := flag.Int("hot", 0, "instead of the loop: this many goroutines, each with a client of its own, contend for one lock of each peer in turn for -hot-for")
	hotFor := flag.Duration("hot-for", 3*time.Second, "how long each peer's hot lock runs (with -hot)")
	flag.Parse()
	if *nodes == "" {
		fmt.Fprintln(os.Stderr, "oploop: -nodes is required")
		os.Exit(64)
	}
	addrs := strings.Split(*nodes, ",")
	ctx := context.Background()
	names := strings.Split(*peers, ",")
	if *hot > 0 {
		for _, name := range names {
			hotLock(ctx, name, addrs, *query, *hot, *hotFor, *cpuprofile)
		}
		return
	}
	ops := make([]func(ctx context.Context) error, len(names))
	for i, name := range names {
		op, closer, err := open(ctx, name, addrs, *query)
		if err != nil {
			fail(err)
		}
		defer closer()
		ops[i] = op
	}
	run := func(op func(context.Context) error) (time.Duration, error) {
		if *opTimeout <= 0 {
			t0 := time.Now()
			err := op(ctx)
			return time.Since(t0), err
		}
		t0 := time.Now()
		octx, cancel := context.WithTimeout(ctx, *opTimeout)
		err := op(octx)
		cancel()
		return time.Since(t0), err
	}
	for range *warm {
		for _, op := range ops {
			if _, err := run(op); err != nil {
				fail(err)
			}
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	admins := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		admins[i] = redis.NewClient(&redis.Options{Addr: a})
		defer admins[i].Close()
	}
	ds := make([][]time.Duration, len(ops))
	s0 := nodesCPU(ctx, admins)
	c0 := cpu()
	t0 := time.Now()
	for round := range *n {
		for k := range ops {
			i := (k + round) % len(ops)
			d, err := run(ops[i])
			if err != nil {
				fail(err)
			}
			ds[i] = append(ds[i], d)
		}
	}
	wall := time.Since(t0)
	c1 := cpu()
	s1 := nodesCPU(ctx, admins)
	all := *n * len(ops)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / float64(all) }
	var p50s []string
	for i, d := range ds {
		sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
		p50s = append(p50s, fmt.Sprintf("%s p50 %.1f µs", names[i], float64(d[len(d)/2].Nanoseconds())/1000))
	}
	fmt.Printf("%s; %d ops: mean %.1f µs, client CPU %.1f µs/op, nodes' CPU %.1f µs/op\n",
		strings.Join(p50s, ", "), all, per(wall), per(c1-c0), per(s1-s0))
}

// open returns peer's Lock+Unlock on a lock of its own.
func open(ctx context.Context, peer string, addrs []string, query string) (func(context.Context) error, func(), error) {
	switch peer {
	case "floor", "redis-floor":
		u := "redlock://" + strings.Join(addrs, ",") + "/0"
		if peer == "redis-floor" {
			u = "redis://" + addrs[0] + "/0"
		}
		f, err := floor.Open(ctx, u)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context) error { return f.AcquireRelease(ctx, "oploop-"+peer) }, func() { _ = f.Close() }, nil
	}
	lock, closer, err := openLocker(ctx, peer, addrs, query, "oploop-"+peer)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context) error {
		unlock, err := lock(ctx)
		if err != nil {
			return err
		}
		return unlock(ctx)
	}, closer, nil
}

// hotLock runs g goroutines, each with a client of its own, on one lock of
// peer for d, and prints the throughput, the hand-off latency and what each
// grant cost: the process's CPU, the nodes' CPU and the commands the nodes
// ran (INFO commandstats, summed over commands and nodes).
func hotLock(ctx context.Context, peer string, addrs []string, query string, g int, d time.Duration, cpuprofile string) {
	lockers := make([]locktest.LockFunc, g)
	for i := range g {
		lf, closer, err := openLocker(ctx, peer, addrs, query, "oploop-hot-"+peer)
		if err != nil {
			fail(err)
		}
		defer closer()
		lockers[i] = lf
	}
	admins := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		admins[i] = redis.NewClient(&redis.Options{Addr: a})
		defer admins[i].Close()
	}
	if cpuprofile != "" {
		f, err := os.Create(peer + "-" + cpuprofile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	s0, k0, c0 := nodesCPU(ctx, admins), nodesCalls(ctx, admins), cpu()
	r, err := locktest.HotLock(ctx, locktest.Budget{Duration: d}, lockers)
	if err != nil {
		fail(err)
	}
	s1, k1, c1 := nodesCPU(ctx, admins), nodesCalls(ctx, admins), cpu()
	h := locktest.Summarize(r.Handoffs)
	per := func(x float64) float64 { return x / float64(max(r.Ops, 1)) }
	var calls []string
	for cmd, n := range k1 {
		if dn := n - k0[cmd]; dn > 0 && cmd != "info" {
			calls = append(calls, fmt.Sprintf("%s %.2f", cmd, per(float64(dn))))
		}
	}
	sort.Strings(calls)
	fmt.Printf("%s hot ×%d: %.0f ops/s, re-take %d/%d, hand-off p50 %.1f µs p99 %.1f µs; per grant: client CPU %.1f µs, nodes' CPU %.1f µs, commands: %s\n",
		peer, g, float64(r.Ops)/r.Elapsed.Seconds(), r.Retakes, max(r.Ops-1, 0),
		float64(h.P50.Nanoseconds())/1000, float64(h.P99.Nanoseconds())/1000,
		per(float64((c1-c0).Nanoseconds())/1000), per(float64((s1-s0).Nanoseconds())/1000), strings.Join(calls, ", "))
}

// openLocker returns peer's Lock of the lock name, as bench/peers's
// contender takes it (a TTL of 30s; bsm/redislock retrying every 100ms,
// redsync a new Mutex per Lock), on a client of its own.
func openLocker(ctx context.Context, peer string, addrs []string, query, name string) (locktest.LockFunc, func(), error) {
	switch peer {
	case "dlock", "redis-dlock":
		u := "redlock://" + strings.Join(addrs, ",") + "/0"
		if peer == "redis-dlock" {
			u = "redis://" + addrs[0] + "/0"
		}
		if query != "" {
			u += "?" + query
		}
		c, err := dlock.Open(ctx, u)
		if err != nil {
			return nil, nil, err
		}
		m := c.NewMutex(name, nil)
		return func(ctx context.Context) (func(context.Context) error, error) {
			l, err := m.Lock(ctx)
			if err != nil {
				return nil, err
			}
			return l.Unlock, nil
		}, func() { _ = c.Close() }, nil
	case "bsm":
		c := redis.NewClient(&redis.Options{Addr: addrs[0]})
		lc := redislock.New(c)
		opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(100 * time.Millisecond)}
		return func(ctx context.Context) (func(context.Context) error, error) {
			l, err := lc.Obtain(ctx, name, 30*time.Second, opt)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}, func() { _ = c.Close() }, nil
	case "redsync":
		var pools []rsredis.Pool
		var cs []*redis.Client
		for _, a := range addrs {
			c := redis.NewClient(&redis.Options{Addr: a})
			cs = append(cs, c)
			pools = append(pools, goredis.NewPool(c))
		}
		rs := redsync.New(pools...)
		return func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(name, redsync.WithExpiry(30*time.Second), redsync.WithTries(math.MaxInt32))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error {
					_, err := m.UnlockContext(ctx)
					return err
				}, nil
			}, func() {
				for _, c := range cs {
					_ = c.Close()
				}
			}, nil
	}
	return nil, nil, fmt.Errorf("unknown peer %q", peer)
}

// nodesCalls is how many times the nodes ran each command (INFO
// commandstats), summed over the nodes.
func nodesCalls(ctx context.Context, cs []*redis.Client) map[string]int64 {
	calls := map[string]int64{}
	for _, c := range cs {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			fail(err)
		}
		for name, st := range redisinfo.Commands(info) {
			calls[name] += st.Calls
		}
	}
	return calls
}

// cpu is the process's user + system CPU time.
func cpu() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nodesCPU is the nodes' redis-server processes' user + system CPU time
// (INFO cpu), summed.
func nodesCPU(ctx context.Context, cs []*redis.Client) time.Duration {
	var sum time.Duration
	for _, c := range cs {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			fail(err)
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
				f, _ := strconv.ParseFloat(v, 64)
				sum += time.Duration(f * float64(time.Second))
			}
		}
	}
	return sum
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "oploop: %v\n", err)
	os.Exit(1)
}
