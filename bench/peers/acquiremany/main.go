// Command acquiremany runs the peer comparison's acquire-many phase (the
// many-held scenario's taking of leases) alone, for one contender on one
// Redis server, so that a system-call counter, a profiler or a scheduler
// trace sees that contender and nothing else.
//
// It opens a client of the contender as bench/peers does (dlock.Open of the
// URL; bsm/redislock and redsync over redis.NewClient of it), takes -warm
// leases, then -n leases of distinct names one after another, each under a
// context.WithTimeout of 30s as the many-held scenario's, holding them all,
// and prints for the -n: wall and CPU time per lease (the process's, every
// thread, user and system), context switches, allocations, the garbage
// collector's CPU (runtime/metrics), the server's time per lease (INFO
// commandstats of the commands the client sent) and the per-lease latency
// percentiles. The peers' keys are left to expire; dlock's leases are
// released by Close, after the timing.
//
// Contenders (-c): dlock (a Client's Mutex.Lock), driver (the dlock Redis
// driver's Acquire without a Client), bsm, redsync, setnx (SET NX PX on a
// go-redis client), and bsm3: a one-script client as bsm/redislock's (a
// go-redis Script.Run on a plain client) whose script does the server work
// of dlock's acquire fast path (4 keys and 5 arguments; EXISTS of the lock
// and its queue, INCR of a counter, SET NX PX): dlock's server cost without
// dlock's client.
//
//	go build -o /tmp/acquiremany ./bench/peers/acquiremany
//	/tmp/acquiremany -redis redis://127.0.0.1:6379/0 -c dlock -cpuprofile /tmp/dlock.pprof
//	/tmp/acquiremany -c dlock -memprofile /tmp/dlock.mprof && go tool pprof -sample_index=alloc_objects -top /tmp/dlock.mprof
//	strace -f -e trace=write,futex -o /tmp/trace /tmp/acquiremany -c bsm -n 2000
//
// To count the system calls of the timed leases alone, give perf stat a
// control FIFO and the same FIFO to -perfctl, which enables the counters
// just before the timed leases and disables them just after (an 8-byte
// write is the Go netpoller's eventfd break):
//
//	mkfifo /tmp/ctl
//	perf stat -D -1 --control fifo:/tmp/ctl -e raw_syscalls:sys_enter \
//		-e syscalls:sys_enter_write --filter 'count == 8' \
//		-e syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait \
//		/tmp/acquiremany -c dlock -perfctl /tmp/ctl
//
// On a machine other processes load, pinning the client and the server to
// one CPU (taskset) takes the scheduler's placement of the two out of the
// figures; compare contenders in alternating runs and read medians.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	neturl "net/url"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisinfo"
	dlockredis "github.com/dlock/dlock/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// peerTTL is the lease of the peers, which do not renew (bench/peers's).
const peerTTL = 10 * time.Minute

func main() {
	url := flag.String("redis", "redis://127.0.0.1:6379/0", "redis:// URL of one server")
	who := flag.String("c", "dlock", "contender: dlock, driver, bsm, redsync, setnx or bsm3 (see the command's doc)")
	n := flag.Int("n", 10000, "leases timed")
	warm := flag.Int("warm", 1000, "leases taken before the timing")
	cpuprof := flag.String("cpuprofile", "", "write a CPU profile of the timed leases here")
	memprof := flag.String("memprofile", "", "write an allocation profile of the timed leases here (every allocation sampled: the timings are not the figures of a run without it)")
	burn := flag.Duration("burn", 0, "CPU to burn (a busy loop) after each lease, to see how the wall time answers to client CPU")
	traceOut := flag.String("trace", "", "write a runtime execution trace of the timed leases here")
	perfctl := flag.String("perfctl", "", "a FIFO of perf stat --control: \"enable\" is written to it before the timed leases, \"disable\" after")
	flag.Parse()
	if *memprof != "" {
		runtime.MemProfileRate = 0 // none of the set-up's and warm-up's allocations
	}
	ctx := context.Background()
	take, closeFn, err := open(ctx, *who, *url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "acquiremany:", err)
		os.Exit(1)
	}
	var lat []time.Duration // per timed lease
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	loop := func(prefix string, count int, rec bool) {
		for i := range count {
			t := time.Now()
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := take(lctx, "am-"+run+"-"+prefix+strconv.Itoa(i))
			cancel()
			if err != nil {
				fmt.Fprintln(os.Stderr, "acquiremany:", err)
				os.Exit(1)
			}
			if rec {
				lat = append(lat, time.Since(t))
			}
			if *burn > 0 {
				for t := time.Now(); time.Since(t) < *burn; {
				}
			}
		}
	}
	loop("w", *warm, false)
	if *memprof != "" {
		runtime.MemProfileRate = 1 // every allocation of the timed leases
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "acquiremany:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer f.Close()
	}
	if *traceOut != "" {
		f, err := os.Create(*traceOut)
		if err != nil {
			fmt.Fprintln(os.Stderr, "acquiremany:", err)
			os.Exit(1)
		}
		defer f.Close()
		_ = trace.Start(f)
	}
	admin := adminClient(*url)
	srv0 := serverUsec(ctx, admin)
	ctl := perfControl(*perfctl)
	ctl("enable")
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	gc0 := gcCPU()
	ru0 := rusage()
	t0 := time.Now()
	lat = make([]time.Duration, 0, *n)
	loop("t", *n, true)
	wall := time.Since(t0)
	if *memprof != "" {
		runtime.MemProfileRate = 0
	}
	ru1 := rusage()
	gc1 := gcCPU()
	runtime.ReadMemStats(&ms1)
	ctl("disable")
	srv := srv0.since(serverUsec(ctx, admin))
	if *cpuprof != "" {
		pprof.StopCPUProfile()
	}
	if *traceOut != "" {
		trace.Stop()
	}
	if *memprof != "" {
		writeMemProfile(*memprof)
	}
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()) - time.Duration(ru0.Utime.Nano()+ru0.Stime.Nano())
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(*n) }
	fmt.Printf("%s: %d leases: wall %.1f µs/lease, cpu %.1f µs/lease, voluntary ctx switches %.2f/lease, involuntary %.2f/lease, allocs %.1f/lease, %.0f B/lease, %d GCs\n",
		*who, *n, per(wall), per(cpu),
		float64(ru1.Nvcsw-ru0.Nvcsw)/float64(*n), float64(ru1.Nivcsw-ru0.Nivcsw)/float64(*n),
		float64(ms1.Mallocs-ms0.Mallocs)/float64(*n), float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(*n), ms1.NumGC-ms0.NumGC)
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	fmt.Printf("  GC cpu %.1f µs/lease (runtime/metrics /cpu/classes/gc/total); cpu: user %.1f, system %.1f µs/lease\n", (gc1-gc0)*1e6/float64(*n),
		per(time.Duration(ru1.Utime.Nano()-ru0.Utime.Nano())), per(time.Duration(ru1.Stime.Nano()-ru0.Stime.Nano())))
	fmt.Printf("  server %.1f µs/lease (INFO commandstats: EVALSHA and EVAL, or SET)\n", srv/float64(*n))
	fmt.Printf("  per lease µs: p10 %.1f p25 %.1f p50 %.1f p75 %.1f p90 %.1f p99 %.1f\n", q(0.1), q(0.25), q(0.5), q(0.75), q(0.9), q(0.99))
	closeFn()
}

// writeMemProfile writes the allocation profile (pprof's allocs: every
// allocation made while MemProfileRate was 1, that is the timed leases') to
// path. A profile counts the allocations of the last completed GC cycle:
// runtime.GC completes one.
func writeMemProfile(path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "acquiremany:", err)
		os.Exit(1)
	}
}

// gcCPU is the CPU time the garbage collector has used so far, in seconds
// (an estimate of the runtime's, as runtime/metrics gives it).
func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return s[0].Value.Float64()
}

// adminClient is a client of its own for INFO, outside the contender's pool.
func adminClient(url string) *redis.Client {
	opt, err := redis.ParseURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "acquiremany:", err)
		os.Exit(1)
	}
	return redis.NewClient(opt)
}

// commandUsec is the server's time so far in each command (INFO
// commandstats), µs by command name.
type commandUsec map[string]float64

func serverUsec(ctx context.Context, c *redis.Client) commandUsec {
	s, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		fmt.Fprintln(os.Stderr, "acquiremany:", err)
		os.Exit(1)
	}
	usec := commandUsec{}
	for name, st := range redisinfo.Commands(s) {
		usec[name] = float64(st.Usec)
	}
	return usec
}

// since is the server's time between u and later in the commands a client
// sends: EVALSHA and EVAL, whose figures include the commands their
// scripts call (which commandstats counts again under their own names),
// or SET when no script ran (the setnx contender).
func (u commandUsec) since(later commandUsec) float64 {
	d := func(cmd string) float64 { return later[cmd] - u[cmd] }
	if s := d("evalsha") + d("eval"); s > 0 {
		return s
	}
	return d("set")
}

// perfControl returns a function that writes a command to perf stat's
// control FIFO at path (a no-op when path is empty).
func perfControl(path string) func(cmd string) {
	if path == "" {
		return func(string) {}
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "acquiremany:", err)
		os.Exit(1)
	}
	return func(cmd string) {
		if _, err := f.WriteString(cmd + "\n"); err != nil {
			fmt.Fprintln(os.Stderr, "acquiremany:", err)
			os.Exit(1)
		}
		time.Sleep(10 * time.Millisecond) // perf reads the FIFO on its own time
	}
}

// rusage is this process's resource usage so far, every thread counted.
func rusage() syscall.Rusage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru
}

// open connects the contender who to the server at url: take takes one
// lease of name, closeFn closes the client.
func open(ctx context.Context, who, url string) (take func(ctx context.Context, name string) error, closeFn func(), err error) {
	if who == "driver" {
		u, err := neturl.Parse(url)
		if err != nil {
			return nil, nil, err
		}
		d, err := dlockredis.OpenURL(ctx, u)
		if err != nil {
			return nil, nil, err
		}
		owner := "owner-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		return func(ctx context.Context, name string) error {
			_, err := d.(driver.Queuer).Acquire(ctx, driver.AcquireRequest{Name: name, Owner: owner, TTL: 30 * time.Second})
			return err
		}, func() { _ = d.Close() }, nil
	}
	if who == "dlock" {
		c, err := dlock.Open(ctx, url)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, name string) error {
			_, err := c.NewMutex(name, nil).Lock(ctx)
			return err
		}, func() { _ = c.Close() }, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, err
	}
	rc := redis.NewClient(opt)
	if err := rc.Ping(ctx).Err(); err != nil {
		return nil, nil, err
	}
	closeFn = func() { _ = rc.Close() }
	switch who {
	case "bsm":
		lc := redislock.New(rc)
		o := &redislock.Options{RetryStrategy: redislock.LinearBackoff(100 * time.Millisecond)}
		return func(ctx context.Context, name string) error {
			_, err := lc.Obtain(ctx, "bsm:"+name, peerTTL, o)
			return err
		}, closeFn, nil
	case "redsync":
		rs := redsync.New(goredis.NewPool(rc))
		return func(ctx context.Context, name string) error {
			return rs.NewMutex("redsync:"+name, redsync.WithExpiry(peerTTL), redsync.WithTries(math.MaxInt32)).LockContext(ctx)
		}, closeFn, nil
	case "bsm3":
		// A one-script client as bsm/redislock's whose script does the
		// server work of dlock's acquire fast path (4 keys, 5 arguments;
		// EXISTS of the lock and its queue, INCR of a counter, SET NX PX).
		slow := redis.NewScript(`
if redis.call("exists", KEYS[1], KEYS[3]) ~= 0 then return false end
local n = redis.call("incr", KEYS[2])
if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return n end
return false
`)
		return func(ctx context.Context, name string) error {
			k := "bsm3:{" + name + "}"
			return slow.Run(ctx, rc, []string{k, k + ":fence", k + ":q", k + ":qd"}, "owner-xxxxxxxxxxxxxxxxxxxxxx", strconv.FormatInt(peerTTL.Milliseconds(), 10), "0", "3000", k+":rel").Err()
		}, closeFn, nil
	case "setnx":
		return func(ctx context.Context, name string) error {
			ok, err := rc.SetNX(ctx, "setnx:"+name, "owner", peerTTL).Result()
			if err == nil && !ok {
				err = fmt.Errorf("%s is taken", name)
			}
			return err
		}, closeFn, nil
	}
	closeFn()
	return nil, nil, fmt.Errorf("unknown contender %q", who)
}
