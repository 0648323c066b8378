//go:build unix

package redislock

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisinfo"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// BenchmarkAcquireMany takes 10,000 locks of distinct names one after
// another, holding them all, as the peer comparison's many-held scenario
// does (a context.WithTimeout per call), in alternating phases on one
// server: the raw floor (SET NX PX on a go-redis client of its own, with
// the driver's pool options) and a dlock Client's Lock. Each round runs
// both phases, in alternating order; the holds are dropped between rounds
// (not timed). Metrics, medians over the rounds (at least 3):
//
//   - floor-µs, lock-µs: wall time per lease, and lock/floor;
//   - floor-cpu-µs, lock-cpu-µs: the CPU time of this process per lease
//     (every thread, user and system: the client's own cost, which on a
//     machine of few cores is wall time too), and cpu-lock/floor;
//   - floor-srv-µs, lock-srv-µs: the Redis server's time per lease (INFO
//     commandstats: usec of SET for the floor, of EVALSHA and EVAL for
//     dlock, divided by the leases), and srv-lock/floor.
func BenchmarkAcquireMany(b *testing.B) {
	const n = 10000
	srv := testserver.Redis(b, nil)
	ctx := context.Background()
	admin := redis.NewClient(mustParseURL(b, srv.URL()))
	defer admin.Close()
	raw := redis.NewClient(mustParseURL(b, srv.URL()))
	defer raw.Close()
	c := dlock.New(openURLDriver(b, srv.URL()), nil)
	defer c.Close()

	serverUsec := func(cmds ...string) float64 {
		s, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		stats := redisinfo.Commands(s)
		var sum float64
		for _, cmd := range cmds {
			sum += float64(stats[cmd].Usec)
		}
		return sum
	}
	type stat struct{ wall, cpu, srv []float64 }
	// phase takes n leases with take and records the cost per lease.
	phase := func(st *stat, take func(ctx context.Context, name string) error, round int, prefix string, cmds ...string) {
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		cpu0 := cpuNow(b)
		t0 := time.Now()
		for i := range n {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := take(lctx, prefix+strconv.Itoa(round)+"-"+strconv.Itoa(i))
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
		wall := time.Since(t0)
		cpu := cpuNow(b) - cpu0
		srvUsec := serverUsec(cmds...)
		st.wall = append(st.wall, float64(wall.Nanoseconds())/1e3/n)
		st.cpu = append(st.cpu, float64(cpu.Nanoseconds())/1e3/n)
		st.srv = append(st.srv, srvUsec/n)
	}
	var floor, lock stat
	var leases []*dlock.Lease
	floorTake := func(ctx context.Context, name string) error {
		ok, err := raw.SetNX(ctx, name, "owner", 30*time.Second).Result()
		if err == nil && !ok {
			err = fmt.Errorf("floor: %s is taken", name)
		}
		return err
	}
	lockTake := func(ctx context.Context, name string) error {
		l, err := c.NewMutex(name, nil).Lock(ctx)
		if err == nil {
			leases = append(leases, l)
		}
		return err
	}
	rounds := max(b.N, 3)
	b.ResetTimer()
	for r := range rounds {
		if r%2 == 0 {
			phase(&floor, floorTake, r, "floor-", "set")
			phase(&lock, lockTake, r, "lock-", "evalsha", "eval")
		} else {
			phase(&lock, lockTake, r, "lock-", "evalsha", "eval")
			phase(&floor, floorTake, r, "floor-", "set")
		}
		b.StopTimer()
		for _, l := range leases {
			_ = l.Unlock(ctx)
		}
		leases = leases[:0]
		if err := admin.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	med := func(xs []float64) float64 {
		ds := make([]time.Duration, len(xs))
		for i, x := range xs {
			ds[i] = time.Duration(x * 1e3)
		}
		return float64(locktest.Median(ds).Nanoseconds()) / 1e3
	}
	for _, m := range []struct {
		name        string
		floor, lock []float64
		ratio       string
	}{
		{"", floor.wall, lock.wall, "lock/floor"},
		{"cpu-", floor.cpu, lock.cpu, "cpu-lock/floor"},
		{"srv-", floor.srv, lock.srv, "srv-lock/floor"},
	} {
		f, l := med(m.floor), med(m.lock)
		b.ReportMetric(f, "floor-"+m.name+"µs")
		b.ReportMetric(l, "lock-"+m.name+"µs")
		if f > 0 {
			b.ReportMetric(l/f, m.ratio)
		}
	}
}

func mustParseURL(tb testing.TB, rawURL string) *redis.Options {
	tb.Helper()
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	return opt
}

// cpuNow is the CPU time this process has used, every thread counted.
func cpuNow(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAcquireLayers splits a Lock of the acquire-many loop (10,000
// leases of distinct names taken one after another, held, a
// context.WithTimeout per call, as BenchmarkAcquireMany) into layers, in
// phases of n leases rotated round-robin on one server:
//
//   - setnx: SET NX PX on a client with the driver's options;
//   - script1: a one-command script (SET NX PX in Lua, one key, three
//     arguments: the shape of bsm/redislock's obtain) on that client;
//   - script3: the server work of the acquire script's fast path in a
//     script of that shape (4 keys, 5 arguments; EXISTS of the lock and
//     its queue, INCR of the fencing counter, SET NX PX);
//   - script: the acquire script itself (redisscript.AcquireQueued);
//   - driver: the driver's Acquire (keys, lane, book of grants);
//   - client: a dlock Client's Mutex.Lock.
//
// Metrics, medians over the rounds (at least 3): <layer>-µs (wall per
// lease), <layer>-cpu-µs (this process's CPU per lease, every thread),
// <layer>-srv-µs (the server's EVALSHA and EVAL usec per lease, SET's for
// setnx; INFO commandstats). The difference between two neighbouring
// layers is what the upper one adds. Run with the process and the
// redis-server pinned to one CPU (taskset) on a machine others load, to
// keep the scheduler's placement of the two out of the figures.
func BenchmarkAcquireLayers(b *testing.B) {
	const n = 5000
	srv := testserver.Redis(b, nil)
	ctx := context.Background()
	admin := redis.NewClient(mustParseURL(b, srv.URL()))
	defer admin.Close()
	u, err := url.Parse(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	opt, _, err := parseURL(u)
	if err != nil {
		b.Fatal(err)
	}
	raw := redis.NewClient(opt) // the driver's client options
	defer raw.Close()
	d := openURLDriver(b, srv.URL())
	c := dlock.New(openURLDriver(b, srv.URL()), nil)
	defer c.Close()
	const owner = "Xk3v9Qm2LpR8sT1uW4yZ6a" // as long as a generated one
	ttl := 30 * time.Second
	script1 := redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3])`)
	script3 := redis.NewScript(`
if redis.call('EXISTS', KEYS[1], KEYS[3]) ~= 0 then return false end
local n = redis.call('INCR', KEYS[2])
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return n end
return false`)
	layers := []struct {
		name string
		take func(ctx context.Context, name string) error
		cmds []string
	}{
		{"setnx", func(ctx context.Context, name string) error {
			return raw.SetNX(ctx, name, owner, ttl).Err()
		}, []string{"set"}},
		{"script1", func(ctx context.Context, name string) error {
			return script1.Run(ctx, raw, []string{name}, owner, len(owner), ttl.Milliseconds()).Err()
		}, []string{"evalsha", "eval"}},
		{"script3", func(ctx context.Context, name string) error {
			k := redisscript.KeysFor(DefaultKeyPrefix, name)
			return script3.Run(ctx, raw, []string{k.Lock, k.Fence, k.Queue, k.Waits}, owner, ttl.Milliseconds(), 0, queueWait.Milliseconds(), k.Channel).Err()
		}, []string{"evalsha", "eval"}},
		{"script", func(ctx context.Context, name string) error {
			_, err := redisscript.AcquireQueued(ctx, raw, redisscript.KeysFor(DefaultKeyPrefix, name), owner, ttl, 0, queueWait)
			return err
		}, []string{"evalsha", "eval"}},
		{"driver", func(ctx context.Context, name string) error {
			_, err := d.Acquire(ctx, driver.AcquireRequest{Name: name, Owner: owner, TTL: ttl})
			return err
		}, []string{"evalsha", "eval"}},
		{"client", func(ctx context.Context, name string) error {
			_, err := c.NewMutex(name, nil).Lock(ctx)
			return err
		}, []string{"evalsha", "eval"}},
	}
	usec := func() map[string]float64 {
		s, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		out := map[string]float64{}
		for cmd, cs := range redisinfo.Commands(s) {
			out[cmd] = float64(cs.Usec)
		}
		return out
	}
	type stat struct{ wall, cpu, srv []float64 }
	st := make([]stat, len(layers))
	rounds := max(b.N, 3)
	b.ResetTimer()
	for r := range rounds {
		for j := range layers {
			i := (j + r) % len(layers)
			l := layers[i]
			u0 := usec()
			cpu0 := cpuNow(b)
			t0 := time.Now()
			for k := range n {
				lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := l.take(lctx, l.name+"-"+strconv.Itoa(r)+"-"+strconv.Itoa(k))
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
			wall := time.Since(t0)
			cpu := cpuNow(b) - cpu0
			u1 := usec()
			var srvUsec float64
			for _, cmd := range l.cmds {
				srvUsec += u1[cmd] - u0[cmd]
			}
			st[i].wall = append(st[i].wall, float64(wall.Nanoseconds())/1e3/n)
			st[i].cpu = append(st[i].cpu, float64(cpu.Nanoseconds())/1e3/n)
			st[i].srv = append(st[i].srv, srvUsec/n)
		}
		b.StopTimer()
		if err := admin.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	med := func(xs []float64) float64 {
		ys := slices.Clone(xs)
		slices.Sort(ys)
		return ys[len(ys)/2]
	}
	for i, l := range layers {
		b.ReportMetric(med(st[i].wall), l.name+"-µs")
		b.ReportMetric(med(st[i].cpu), l.name+"-cpu-µs")
		b.ReportMetric(med(st[i].srv), l.name+"-srv-µs")
	}
}
