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
	Lock  string // the lock's key (a mutex's, or a read/write lock's writer key)
	Owner string
	Token uint64 // 0: do not check the token
	TTL   time.Duration
	// Holders and Values are, for a reader or a permit holder, the keys of
	// its holder set (KindKeys.Holders and Values); Lock is then ignored.
	Holders, Values string
}

// renewChunk bounds the keys of one renew script call, so that a tick with
// many leases does not stall the server for long in one script.
const renewChunk = 512

// Pipeliner is what Renew needs of a client: any redis.UniversalClient, or
// one *redis.Conn (so that a WAIT sent on it afterwards covers the
// renewals).
type Pipeliner interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// Renew extends every item on one server in one round trip: on a plain
// *redis.Client (or one *redis.Conn of it) the items go in chunks of multi-key script calls (mutexes
// and writers in one script, readers and permits in another), on other
// clients (cluster, ring) as one script call per item; either way in one
// pipeline. After a flushed script cache it takes one more round trip.
//
// errs[i] is nil when item i was renewed, wraps driver.ErrNotHeld when it is
// not held, or is another error when its fate is unknown. err is non-nil
// only when nothing could be sent.
func Renew(ctx context.Context, c Pipeliner, items []RenewItem) (errs []error, err error) {
	errs = make([]error, len(items))
	if len(items) == 0 {
		return errs, nil
	}
	chunk := 1
	switch c.(type) {
	case *redis.Client, *redis.Conn:
		chunk = renewChunk
	}
	type call struct {
		script *redis.Script
		idx    []int // the items of this call
		keys   []string
		args   []any
		cmd    *redis.Cmd
	}
	var calls []*call
	var cur [2]*call // open call per script: 0 mutex format, 1 holder set
	for i, it := range items {
		s := 0
		if it.Holders != "" {
			s = 1
		}
		cl := cur[s]
		if cl == nil || len(cl.idx) == chunk {
			cl = &call{script: renewScript}
			if s == 1 {
				cl.script = renewSetScript
			}
			cur[s] = cl
			calls = append(calls, cl)
		}
		cl.idx = append(cl.idx, i)
		if s == 1 {
			cl.keys = append(cl.keys, it.Holders, it.Values)
		} else {
			cl.keys = append(cl.keys, it.Lock)
		}
		cl.args = append(cl.args, it.Owner, strconv.FormatUint(it.Token, 10), Millis(it.TTL))
	}

	run := func(cs []*call) error {
		pipe := c.Pipeline()
		for _, cl := range cs {
			cl.cmd = cl.script.EvalSha(ctx, pipe, cl.keys, cl.args...)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	pipeErr := run(calls)
	var missing []*call
	loaded := map[*redis.Script]bool{}
	for _, cl := range calls {
		if isNoScript(cl.cmd.Err()) {
			missing = append(missing, cl)
			if !loaded[cl.script] {
				loaded[cl.script] = true
				if err := cl.script.Load(ctx, c).Err(); err != nil {
					return nil, err
				}
			}
		}
	}
	if len(missing) > 0 {
		pipeErr = run(missing)
	}
	sent := false
	for _, cl := range calls {
		if err := cl.cmd.Err(); err != nil {
			for _, i := range cl.idx {
				errs[i] = err
			}
			continue
		}
		sent = true
		v, err := cl.cmd.Slice()
		if err == nil && len(v) != len(cl.idx) {
			err = fmt.Errorf("renew script returned %d results for %d leases", len(v), len(cl.idx))
		}
		for j, i := range cl.idx {
			switch {
			case err != nil:
				errs[i] = err
			case v[j] == int64(1):
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
