package redlock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/redisscript"
)

// acquireWaiting runs redisscript's mutex acquire script for owner, a
// waiting Lock refused before, queued at score (a time by the waiter's
// clock, ms) rather than at the server's time, so that every node orders
// Redlock's waiters alike; a refusal queues the owner, or renews its
// entry's deadline, in the same call.
func acquireWaiting(ctx context.Context, c redis.Scripter, k redisscript.Keys, owner string, ttl, delay time.Duration, score int64) (redisscript.AcquireResult, error) {
	return redisscript.AcquireAtScore(ctx, c, k, owner, ttl, delay, queueWait, score)
}
