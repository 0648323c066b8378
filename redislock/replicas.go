package redislock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/openurl"
)

// DefaultReplicaTimeout is how long a grant waits for its replicas when
// Options.MinReplicas is set and Options.ReplicaTimeout is zero.
const DefaultReplicaTimeout = time.Second

// ErrNotReplicated is wrapped by the error of a grant, a renewal or a fence
// raise that fewer than Options.MinReplicas replicas acknowledged within
// Options.ReplicaTimeout (Redis WAIT). Such a grant is released before the
// error returns (or, when the release fails, booked for Close and left to
// expire) and is never handed to the caller; a waiting Lock retries it like
// any backend error. Such a renewal counts as not confirmed: the lease keeps
// the deadline of its last confirmed renewal.
var ErrNotReplicated = errors.New("redislock: not acknowledged by enough replicas in time")

// replicaParams are the URL parameters of Options.MinReplicas and
// Options.ReplicaTimeout, taken by every scheme of this package.
var replicaParams = []string{"min_replicas", "replica_timeout"}

// takeReplicaParams moves min_replicas and replica_timeout from q into o.
func takeReplicaParams(q url.Values, o *Options) error {
	if v, ok := q["min_replicas"]; ok {
		n, err := strconv.Atoi(v[len(v)-1])
		if err != nil || n < 0 {
			return fmt.Errorf("redislock: URL parameter min_replicas=%q is not a whole number ≥ 0", v[len(v)-1])
		}
		o.MinReplicas = n
	}
	if v, ok := q["replica_timeout"]; ok {
		d, err := time.ParseDuration(v[len(v)-1])
		if err != nil || d < time.Millisecond {
			return fmt.Errorf("redislock: URL parameter replica_timeout=%q is not a duration of at least 1ms (e.g. 500ms)", v[len(v)-1])
		}
		o.ReplicaTimeout = d
	}
	for _, p := range replicaParams {
		q.Del(p)
	}
	return nil
}

// replicaOptions checks o's MinReplicas and ReplicaTimeout against client
// and returns the values the driver uses.
func replicaOptions(client redis.UniversalClient, o *Options) (single *redis.Client, n int, timeout time.Duration, err error) {
	if o == nil || (o.MinReplicas == 0 && o.ReplicaTimeout == 0) {
		return nil, 0, 0, nil
	}
	if o.MinReplicas < 0 {
		return nil, 0, 0, openurl.Invalid("MinReplicas", "redislock: MinReplicas %d is below 0", o.MinReplicas)
	}
	timeout = o.ReplicaTimeout
	switch {
	case timeout == 0:
		timeout = DefaultReplicaTimeout
	case timeout < time.Millisecond:
		return nil, 0, 0, openurl.Invalid("ReplicaTimeout", "redislock: ReplicaTimeout %v is below 1ms (WAIT counts whole milliseconds, and 0 would wait forever)", timeout)
	}
	if o.MinReplicas == 0 {
		return nil, 0, 0, nil
	}
	single, ok := client.(*redis.Client)
	if !ok {
		return nil, 0, 0, openurl.Invalid("MinReplicas", "redislock: MinReplicas needs one master behind a *redis.Client (a plain or a Sentinel failover client), not a %T", client)
	}
	return single, o.MinReplicas, timeout, nil
}

// conn returns what a state change runs on: the driver's client, or with
// MinReplicas one connection of it (so that WAIT on it covers the change),
// and the function that gives that connection back.
func (d *Driver) conn() (redis.UniversalClient, func()) {
	if d.minReplicas == 0 {
		return d.client, func() {}
	}
	c := d.single.Conn()
	return connClient{UniversalClient: d.client, conn: c}, func() { _ = c.Close() }
}

// replicated waits with WAIT on c (from conn) until d.minReplicas replicas
// have every write made on c. It returns nil at once without MinReplicas, an
// error wrapping ErrNotReplicated when too few acknowledged in time, and
// another error when the outcome is unknown.
func (d *Driver) replicated(ctx context.Context, c redis.UniversalClient) error {
	cc, ok := c.(connClient)
	if d.minReplicas == 0 || !ok {
		return nil
	}
	n, err := cc.conn.Wait(ctx, d.minReplicas, d.replicaTimeout).Result()
	if err != nil {
		return fmt.Errorf("WAIT for %d replicas: %w", d.minReplicas, err)
	}
	if int(n) < d.minReplicas {
		return fmt.Errorf("%d of %d replicas acknowledged within %v: %w", n, d.minReplicas, d.replicaTimeout, ErrNotReplicated)
	}
	return nil
}

// undo runs fn, which gives up a grant that was not replicated, on the
// driver's client with a context of its own: ctx may be about to end, and
// the connection the grant came on may be broken.
func (d *Driver) undo(ctx context.Context, fn func(ctx context.Context, c redis.UniversalClient)) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	fn(uctx, d.client)
}

// connClient is one connection of the driver's client, usable where the
// script helpers take a client: it runs scripts and pipelines on conn. Its
// other methods are the driver's client's; the driver uses none of them on
// a connClient.
type connClient struct {
	redis.UniversalClient
	conn *redis.Conn
}

func (c connClient) Pipeline() redis.Pipeliner { return c.conn.Pipeline() }

func (c connClient) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	return c.conn.Pipelined(ctx, fn)
}

func (c connClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.conn.Eval(ctx, script, keys, args...)
}

func (c connClient) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return c.conn.EvalSha(ctx, sha1, keys, args...)
}

func (c connClient) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.conn.EvalRO(ctx, script, keys, args...)
}

func (c connClient) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return c.conn.EvalShaRO(ctx, sha1, keys, args...)
}

func (c connClient) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return c.conn.ScriptExists(ctx, hashes...)
}

func (c connClient) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return c.conn.ScriptLoad(ctx, script)
}

// notReplicatedRenewals marks as not confirmed every renewal in errs that
// succeeded on the master, when WAIT says too few replicas have them (or
// cannot say).
func notReplicatedRenewals(errs []error, werr error) {
	for i, e := range errs {
		if e == nil {
			errs[i] = werr
		}
	}
}
