package redisscript

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
)

// RenewItem is one lease to renew.
type RenewItem struct {
	Lock  string // the lock's key
	Owner string
	Token uint64 // 0: do not check the token
	TTL   time.Duration
}

// renewChunk bounds the keys of one renew script call, so that a tick with
// many leases does not stall the server for long in one script.
const renewChunk = 512

// Renew extends every item on one server in one round trip: on a plain
// *redis.Client the items go in chunks of multi-key script calls, on other
// clients (cluster, ring) as one script call per item; either way in one
// pipeline. After a flushed script cache it takes one more round trip.
//
// errs[i] is nil when item i was renewed, wraps driver.ErrNotHeld when it is
// not held, or is another error when its fate is unknown. err is non-nil
// only when nothing could be sent.
func Renew(ctx context.Context, c redis.UniversalClient, items []RenewItem) (errs []error, err error) {
	errs = make([]error, len(items))
	if len(items) == 0 {
		return errs, nil
	}
	chunk := 1
	if _, single := c.(*redis.Client); single {
		chunk = renewChunk
	}
	type call struct {
		lo, hi int
		keys   []string
		args   []any
		cmd    *redis.Cmd
	}
	calls := make([]*call, 0, (len(items)+chunk-1)/chunk)
	for lo := 0; lo < len(items); lo += chunk {
		hi := min(lo+chunk, len(items))
		cl := &call{lo: lo, hi: hi, keys: make([]string, 0, hi-lo), args: make([]any, 0, 3*(hi-lo))}
		for _, it := range items[lo:hi] {
			cl.keys = append(cl.keys, it.Lock)
			cl.args = append(cl.args, it.Owner, strconv.FormatUint(it.Token, 10), Millis(it.TTL))
		}
		calls = append(calls, cl)
	}

	run := func(cs []*call) error {
		pipe := c.Pipeline()
		for _, cl := range cs {
			cl.cmd = renewScript.EvalSha(ctx, pipe, cl.keys, cl.args...)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	pipeErr := run(calls)
	var missing []*call
	for _, cl := range calls {
		if isNoScript(cl.cmd.Err()) {
			missing = append(missing, cl)
		}
	}
	if len(missing) > 0 {
		if err := renewScript.Load(ctx, c).Err(); err != nil {
			return nil, err
		}
		pipeErr = run(missing)
	}
	sent := false
	for _, cl := range calls {
		if err := cl.cmd.Err(); err != nil {
			for i := cl.lo; i < cl.hi; i++ {
				errs[i] = err
			}
			continue
		}
		sent = true
		v, err := cl.cmd.Slice()
		if err == nil && len(v) != cl.hi-cl.lo {
			err = fmt.Errorf("renew script returned %d results for %d keys", len(v), cl.hi-cl.lo)
		}
		for i := cl.lo; i < cl.hi; i++ {
			switch {
			case err != nil:
				errs[i] = err
			case v[i-cl.lo] == int64(1):
				errs[i] = nil
			default:
				errs[i] = driver.ErrNotHeld
			}
		}
	}
	if !sent && pipeErr != nil {
		return nil, pipeErr
	}
	return errs, nil
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}
