package redlock

import (
	"context"
	"testing"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript/redistest"
	"github.com/dlock/dlock/internal/testserver"
)

// BenchmarkFairness3: see redistest.BenchFairness, on 3 nodes.
func BenchmarkFairness3(b *testing.B) {
	srvs := testserver.RedisN(b, 3, nil)
	raw := redlockURL(srvs, "")
	redistest.BenchFairness(b, func(ctx context.Context) (driver.Driver, error) { return openTest(ctx, raw) })
}
