package redlock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// serverStats are the nodes' CPU (user + system, whole process, from INFO
// cpu) and their script and command counts and times (INFO commandstats),
// summed over the nodes.
type serverStats struct {
	cpu     time.Duration
	calls   int64
	usec    int64
	byCmd   map[string][2]int64 // calls, usec
	perNode []time.Duration
}

func readServerStats(b testing.TB, cs []*redis.Client) serverStats {
	ctx := context.Background()
	s := serverStats{byCmd: map[string][2]int64{}}
	for _, c := range cs {
		info, err := c.Info(ctx, "cpu", "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		var node time.Duration
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch {
			case k == "used_cpu_sys" || k == "used_cpu_user":
				f, _ := strconv.ParseFloat(v, 64)
				node += time.Duration(f * float64(time.Second))
			case strings.HasPrefix(k, "cmdstat_"):
				var calls, usec int64
				for _, kv := range strings.Split(v, ",") {
					name, val, _ := strings.Cut(kv, "=")
					switch name {
					case "calls":
						calls, _ = strconv.ParseInt(val, 10, 64)
					case "usec":
						usec, _ = strconv.ParseInt(val, 10, 64)
					}
				}
				cmd := strings.TrimPrefix(k, "cmdstat_")
				if cmd == "info" || cmd == "config|resetstat" {
					continue
				}
				x := s.byCmd[cmd]
				s.byCmd[cmd] = [2]int64{x[0] + calls, x[1] + usec}
				s.calls += calls
				s.usec += usec
			}
		}
		s.cpu += node
		s.perNode = append(s.perNode, node)
	}
	return s
}

func resetServerStats(b testing.TB, cs []*redis.Client) {
	for _, c := range cs {
		if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// costOf runs op for the benchmark's b.N ops (run reports how many it
// did) and reports, per op, the CPU of the test process (client-cpu-µs),
// of the nodes (server-cpu-µs, all of each redis-server process: network
// included), the time the nodes spent in commands (cmd-µs, commandstats)
// and the commands run (cmds).
func costOf(b *testing.B, cs []*redis.Client, run func() int) {
	resetServerStats(b, cs)
	s0 := readServerStats(b, cs)
	c0 := processCPU()
	b.ResetTimer()
	ops := run()
	b.StopTimer()
	c1 := processCPU()
	s1 := readServerStats(b, cs)
	if ops == 0 {
		return
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / float64(ops) }
	b.ReportMetric(per(c1-c0), "client-cpu-µs/op")
	b.ReportMetric(per(s1.cpu-s0.cpu), "server-cpu-µs/op")
	b.ReportMetric(float64(s1.usec)/float64(ops), "cmd-µs/op")
	b.ReportMetric(float64(s1.calls)/float64(ops), "cmds/op")
	if testing.Verbose() {
		for cmd, x := range s1.byCmd {
			b.Logf("%d ops: %s: %.2f calls/op, %.2f µs/call", ops, cmd, float64(x[0])/float64(ops), float64(x[1])/float64(max(x[0], 1)))
		}
	}
}

// BenchmarkCost3 splits the CPU of an uncontended Lock+Unlock and of a
// hot lock's hand-off (8 clients, one lock) on 3 nodes between the client
// and the nodes, for dlock and the redsync-like peer (rsLike), and counts
// the nodes' commands: on a 2-core machine running clients and nodes,
// CPU per hand-off is what bounds a hot lock's throughput.
func BenchmarkCost3(b *testing.B) {
	srvs := testserver.RedisN(b, 3, nil)
	ctx := context.Background()
	cs := newRSLike(b, srvs).cs
	uncontended := func(b *testing.B, lf locktest.LockFunc) func() int {
		return func() int {
			for range b.N {
				u, err := lf(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := u(ctx); err != nil {
					b.Fatal(err)
				}
			}
			return b.N
		}
	}
	hot := func(b *testing.B, lockers []locktest.LockFunc) func() int {
		return func() int {
			ops := 0
			var el time.Duration
			var retakes int
			for range b.N {
				r, err := locktest.HotLock(ctx, locktest.Budget{Duration: time.Second}, lockers)
				if err != nil {
					b.Fatal(err)
				}
				ops += r.Ops
				el += r.Elapsed
				retakes += r.Retakes
			}
			b.ReportMetric(float64(ops)/el.Seconds(), "ops/s")
			if ops > 1 {
				b.ReportMetric(100*float64(retakes)/float64(ops-1), "retake-%")
			}
			return ops
		}
	}
	b.Run("uncontended/dlock", func(b *testing.B) {
		m := perfClient(b, srvs).NewMutex("cost-unc", nil)
		costOf(b, cs, uncontended(b, locktest.MutexLocker(m)))
	})
	b.Run("uncontended/rslike", func(b *testing.B) {
		costOf(b, cs, uncontended(b, newRSLike(b, srvs).lock("cost-unc-rs")))
	})
	b.Run("hot/dlock", func(b *testing.B) {
		var lockers []locktest.LockFunc
		for range 8 {
			lockers = append(lockers, locktest.MutexLocker(perfClient(b, srvs).NewMutex("cost-hot", nil)))
		}
		costOf(b, cs, hot(b, lockers))
	})
	b.Run("hot/rslike", func(b *testing.B) {
		var lockers []locktest.LockFunc
		for range 8 {
			lockers = append(lockers, newRSLike(b, srvs).lock("cost-hot-rs"))
		}
		costOf(b, cs, hot(b, lockers))
	})
}
