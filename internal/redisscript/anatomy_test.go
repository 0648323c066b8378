package redisscript

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// BenchmarkScriptAnatomy takes the server time of the uncontended acquire
// and release scripts apart (INFO commandstats usec_per_call of evalsha,
// medians of 7 rounds of 2,000 calls, variants alternated round-robin): an
// empty script with the acquire's 4 keys and 5 arguments and with 1 and 1,
// a script of the one SET … PX a grant needs, then the acquire's commands
// added one by one up to the real script; and the release's, from GET and
// DEL up to the real granting release. It is what bounds dlock's
// uncontended Lock+Unlock against a peer without a fencing counter, a
// queue or a release notification (docs/performance.md, ninth round).
func BenchmarkScriptAnatomy(b *testing.B) {
	ctx := context.Background()
	c, stats := statsServer(b)
	usec := func() float64 { return stats()["evalsha"].UsecPerCall }
	type variant struct {
		name string
		s    *redis.Script
		keys func(k Keys) []string
		args func(k Keys) []any
	}
	k4 := func(k Keys) []string { return []string{k.Lock, k.Fence, k.queue(), k.waits()} }
	a5 := func(k Keys) []any { return []any{"owner", 60000, 0, 3000, k.Channel} }
	vs := []variant{
		{"empty-4keys-5args", redis.NewScript(`return 1`), k4, a5},
		{"empty-1key-1arg", redis.NewScript(`return 1`), func(k Keys) []string { return []string{k.Lock} }, func(Keys) []any { return []any{"owner"} }},
		{"set", redis.NewScript(`redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1`), k4, a5},
		{"incr+set", redis.NewScript(`local n = redis.call('INCR', KEYS[2]) redis.call('SET', KEYS[1], '1\n' .. n .. '\n\n\n' .. ARGV[1], 'PX', ARGV[2]) return n`), k4, a5},
		{"exists+incr+set", redis.NewScript(`local free = redis.call('EXISTS', KEYS[1], KEYS[3]) == 0
local n = redis.pcall('INCR', KEYS[2])
if type(n) == 'number' and n >= 1 then
redis.call('SET', KEYS[1], '1\n' .. (n < 1e14 and n or string.format('%.0f', n)) .. '\n\n\n' .. ARGV[1], 'PX', ARGV[2]) return n end return 0`), k4, a5},
		{"acquire", acquireScript, k4, a5},
		{"release", grantReleaseEval.s, func(k Keys) []string { return []string{k.Lock, k.queue(), k.waits(), k.Fence} }, func(k Keys) []any { return []any{"owner", 1, k.Channel} }},
		{"release:no-grant", releaseScript, func(k Keys) []string { return []string{k.Lock, k.queue(), k.waits()} }, func(k Keys) []any { return []any{"owner", 1, k.Channel} }},
		{"release:get+del", redis.NewScript(`local v = redis.call('GET', KEYS[1]) if v == '1\n' .. ARGV[2] .. '\n\n\n' .. ARGV[1] then redis.call('DEL', KEYS[1]) return 0 end return -1`), func(k Keys) []string { return []string{k.Lock, k.queue(), k.waits(), k.Fence} }, func(k Keys) []any { return []any{"owner", 1, k.Channel} }},
		{"release:get+exists+del", redis.NewScript(`local v = redis.call('GET', KEYS[1]) if v == '1\n' .. ARGV[2] .. '\n\n\n' .. ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then redis.call('DEL', KEYS[1]) return 0 end return -1`), func(k Keys) []string { return []string{k.Lock, k.queue(), k.waits(), k.Fence} }, func(k Keys) []any { return []any{"owner", 1, k.Channel} }},
		{"release:get+exists+del+pub", redis.NewScript(`local v = redis.call('GET', KEYS[1]) if v == '1\n' .. ARGV[2] .. '\n\n\n' .. ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[3], ARGV[2]) return 0 end return -1`), func(k Keys) []string { return []string{k.Lock, k.queue(), k.waits(), k.Fence} }, func(k Keys) []any { return []any{"owner", 1, k.Channel} }},
	}
	const calls = 2000
	res := make([][]float64, len(vs))
	seq := 0
	for round := 0; round < 8; round++ {
		for i, v := range vs {
			keys := make([]Keys, calls)
			for j := range keys {
				seq++
				keys[j] = KeysFor(DefaultPrefix, "tc-"+strconv.Itoa(seq))
			}
			_ = v.s.Load(ctx, c).Err()
			// Every name has been used before, as a lock taken again and
			// again is: its fencing counter exists (an INCR that creates
			// the key costs about twice as much), and a release finds its
			// lock held.
			for _, k := range keys {
				if strings.HasPrefix(v.name, "release") {
					_ = c.Set(ctx, k.Lock, "1\n1\n\n\nowner", 0).Err()
				} else {
					_ = c.Set(ctx, k.Fence, "5", 0).Err()
				}
			}
			_ = c.ConfigResetStat(ctx).Err()
			for _, k := range keys {
				r, err := v.s.Run(ctx, c, v.keys(k), v.args(k)...).Int64()
				if err != nil || (strings.HasPrefix(v.name, "release") && r != 0) {
					b.Fatalf("%s: %v %v", v.name, r, err)
				}
			}
			if round > 0 {
				res[i] = append(res[i], usec())
			}
			_ = c.FlushAll(ctx).Err()
		}
	}
	b.ResetTimer()
	for i, v := range vs {
		sort.Float64s(res[i])
		b.ReportMetric(res[i][len(res[i])/2], v.name+"-µs")
	}
}
