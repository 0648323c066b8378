package redlock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/redisscript"
)

// Redlock's grant-in-release scripts are redisscript's (see its
// grant.go and docs/protocol.md): a waiting acquire that asks for the
// lock to be granted in the release that frees it, a release that grants
// it to a listening queue head, and a leave that drops the request.

// grantsKey is the qg hash of the lock whose keys are k.
func grantsKey(k redisscript.Keys) string { return redisscript.GrantsKey(k) }

// acquireWaiting runs the waiting acquire on n for a queued waiter at score
// whose driver listens for grants on grantCh. It also returns, for a
// refusal, the node's fencing counter as the script saw it.
func acquireWaiting(ctx context.Context, c redis.Scripter, k redisscript.Keys, owner string, ttl, delay time.Duration, score int64, grantCh string) (redisscript.AcquireResult, uint64, error) {
	return redisscript.AcquireWaiting(ctx, c, k, owner, ttl, delay, queueWait, score, grantCh)
}

// releaseGranting runs the granting release on n: one hold of owner's grant
// (token 0: any token) is released; a freed lock goes to the first queued
// waiter that asked for grants, or wakes it. held is false when owner did
// not hold the lock.
func releaseGranting(ctx context.Context, c redis.Scripter, k redisscript.Keys, owner string, token uint64) (remaining int, held bool, err error) {
	return redisscript.ReleaseGranting(ctx, c, k, owner, token)
}

// leaveGranting takes owner out of k's queue and drops its qg record.
func leaveGranting(ctx context.Context, c redis.Scripter, k redisscript.Keys, owner string) error {
	return redisscript.LeaveGranting(ctx, c, k, owner)
}
