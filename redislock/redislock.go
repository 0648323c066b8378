// Package redislock is the dlock driver for one Redis server (or a Redis
// Cluster, or a Sentinel-managed primary) over go-redis v9.
//
// Import it for its side effect to make the redis:// and rediss:// URL
// schemes available to dlock.Open:
//
//	import _ "github.com/dlock/dlock/redislock"
//
//	client, err := dlock.Open(ctx, "redis://:secret@localhost:6379/0")
//
// or construct a driver over a go-redis client you already have with New.
//
// # How a lock is kept
//
// Every state change is one Lua script run with EVALSHA (falling back to
// EVAL after a flushed script cache), so it is atomic on the server. A lock
// named N is a string at "dlock:{N}" holding the owner, the hold count, the
// fencing token and, with a lock-delay, the lease's expiry by the server's
// clock; the key's own PX expiry is the TTL plus the lock-delay. The fencing counter lives in a
// companion key "dlock:{N}:fence" in the same hash slot, is incremented by
// the acquire script for every new grant and is never deleted, so tokens keep
// rising across releases, expiries and crashed holders. Names containing
// '{' or '}' (or starting with '~') are stored base64-encoded, so a user's
// braces can never change a key's hash slot, and two names never share keys.
//
// A release deletes the key and publishes on "dlock:{N}:rel". Waiters of
// one driver share a single pub/sub connection; see Driver.Subscribe for who
// is woken.
//
// # Guarantees and their limits
//
// Mutual exclusion holds as far as the Redis server's memory does: on one
// server without failover it holds among live holders. With replication
// (Sentinel, Cluster) a grant acknowledged by a primary can be lost when the
// primary fails before the replica has it, because Redis replicates
// asynchronously; a second holder is then possible. Fencing tokens are
// stored the same way and share that limit. Use the redlock driver, or a
// consensus backend (etcd, ZooKeeper), if failover must not break
// exclusion.
package redislock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

func init() {
	dlock.Register("redis", openURL)
	dlock.Register("rediss", openURL)
}

// DefaultKeyPrefix is the prefix of every key and channel when
// Options.KeyPrefix is empty.
const DefaultKeyPrefix = redisscript.DefaultPrefix

// Options configure a Driver. The zero value (or nil) gives the defaults.
// Each field maps to the URL query parameter named in its comment.
type Options struct {
	// KeyPrefix is prepended to every key and channel the driver uses
	// (URL parameter key_prefix). It must not contain '{', '}', glob
	// characters (*?[]\) or control characters. Default "dlock:".
	KeyPrefix string
}

// Driver is a dlock driver over one go-redis client. It implements
// driver.Driver, driver.Notifier, driver.Inspector and driver.Limiter, and is
// safe for concurrent use.
type Driver struct {
	client redis.UniversalClient
	own    bool // Close closes client (opened from a URL)
	prefix string
	hub    *redisscript.Hub

	closeOnce sync.Once
	closeErr  error
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Notifier  = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
	_ driver.Limiter   = (*Driver)(nil)
)

// New returns a driver that keeps locks through client. Close does not close
// client.
//
// Give client ContextTimeoutEnabled: true so that context deadlines bound
// every network wait; without it go-redis bounds reads by its ReadTimeout
// only. With a *redis.ClusterClient a lock's keys share one slot by their
// hash tag, and renewal sends one script call per lease in one pipeline per
// node.
func New(client redis.UniversalClient, o *Options) (*Driver, error) {
	if client == nil {
		return nil, errors.New("redislock: client is nil")
	}
	prefix := DefaultKeyPrefix
	if o != nil && o.KeyPrefix != "" {
		prefix = o.KeyPrefix
	}
	if err := redisscript.CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("redislock: invalid KeyPrefix: %w", err)
	}
	return &Driver{client: client, prefix: prefix, hub: redisscript.NewHub(client, nil)}, nil
}

func (d *Driver) keys(name string, handle any) redisscript.Keys {
	if k, ok := handle.(*redisscript.Keys); ok && k != nil {
		return *k
	}
	return redisscript.KeysFor(d.prefix, name)
}

// TryAcquire takes, re-enters or is refused the lock in one script call.
// A refusal is a *driver.LockedError whose RetryAfter is the key's remaining
// PTTL: the holder's remaining lease plus its lock-delay.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	k := redisscript.KeysFor(d.prefix, req.Name)
	r, err := redisscript.Acquire(ctx, d.client, k, req.Owner, req.TTL, req.LockDelay)
	if err != nil {
		return driver.Grant{}, wrap(ctx, "acquire", err)
	}
	if !r.Granted {
		return driver.Grant{}, &driver.LockedError{RetryAfter: r.PTTL, Token: r.Fence}
	}
	return driver.Grant{Token: r.Fence, Count: r.Count, Handle: &k}, nil
}

// Release gives up one hold. The last hold deletes the lock at once and
// publishes on its release channel.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	remaining, held, err := redisscript.Release(ctx, d.client, d.keys(l.Name, l.Handle), l.Owner, l.Token)
	if err != nil {
		return 0, wrap(ctx, "release", err)
	}
	if !held {
		return 0, driver.ErrNotHeld
	}
	return remaining, nil
}

// Renew extends every lease in one round trip (see the package doc).
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	items := make([]redisscript.RenewItem, len(ls))
	for i, l := range ls {
		items[i] = redisscript.RenewItem{Lock: d.keys(l.Name, l.Handle).Lock, Owner: l.Owner, Token: l.Token, TTL: l.TTL}
	}
	errs, err := redisscript.Renew(ctx, d.client, items)
	if err != nil {
		return nil, wrap(ctx, "renew", err)
	}
	for i, e := range errs {
		if e != nil && !errors.Is(e, driver.ErrNotHeld) {
			errs[i] = wrap(ctx, "renew", e)
		}
	}
	return errs, nil
}

// Subscribe registers for release notifications of name. It costs no round
// trip: the driver's one pub/sub connection is shared by every waiter, each
// channel is subscribed once however many goroutines wait on it, and the
// SUBSCRIBE is written without waiting for the reply (the subscription
// wakes its waiter once the server confirms it, so a release that slipped in
// before is not missed).
//
// A release wakes one waiter of this driver, the one waiting longest; a
// waiter that closes its subscription with a wake-up unconsumed passes it
// on. Every driver (process) waiting on the name is woken once.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	sig := make(chan struct{}, 1)
	s, err := d.hub.Subscribe(ctx, redisscript.KeysFor(d.prefix, name).Channel, sig)
	if err != nil {
		return nil, wrap(ctx, "subscribe", err)
	}
	return &subscription{sub: s, sig: sig}, nil
}

type subscription struct {
	sub  *redisscript.Sub
	sig  chan struct{}
	once sync.Once
}

func (s *subscription) C() <-chan struct{} { return s.sig }

func (s *subscription) Close() error {
	s.once.Do(func() {
		pending := false
		select {
		case <-s.sig:
			pending = true
		default:
		}
		s.sub.Close(pending)
	})
	return nil
}

// Inspect lists the locks whose names start with prefix, free ones that
// were once taken included (they keep their fencing counter). ExpiresIn is
// the time until the lock frees itself if nobody renews or releases it,
// lock-delay included. Waiters is -1 (unknown). It SCANs the key space (on
// every primary of a cluster), so it is meant for status output, not for hot
// paths.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	nodes, err := redisscript.Inspect(ctx, d.client, d.prefix, prefix)
	if err != nil {
		return nil, wrap(ctx, "inspect", err)
	}
	out := make([]driver.LockInfo, len(nodes))
	for i, n := range nodes {
		out[i] = driver.LockInfo{Name: n.Name, Owner: n.Owner, Token: n.Fence, Count: n.Count, ExpiresIn: n.PTTL, Waiters: -1}
	}
	return out, nil
}

// Limits reports millisecond TTL granularity (PX).
func (d *Driver) Limits() driver.Limits {
	return driver.Limits{MinTTL: time.Millisecond, TTLGranularity: time.Millisecond}
}

// Close stops the driver's pub/sub connection. It closes the go-redis
// client only if the driver opened it from a URL. Locks still held are left
// to expire. Close is idempotent.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		d.closeErr = d.hub.Close()
		if d.own {
			if err := d.client.Close(); d.closeErr == nil {
				d.closeErr = err
			}
		}
	})
	return d.closeErr
}

// kill drops every connection at once without releasing anything, as a
// crashed process would. For tests.
func (d *Driver) kill() {
	_ = d.hub.Close()
	_ = d.client.Close()
}

// wrap adds the operation to err, and makes sure an error caused by ctx
// wraps ctx.Err() (go-redis reports a missed deadline as an i/o timeout).
func wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("redislock: %s: %w (%v)", op, cerr, err)
	}
	return fmt.Errorf("redislock: %s: %w", op, err)
}

// ourParams are the URL query parameters that configure the driver; every
// other parameter goes to go-redis (redis.ParseURL), which refuses unknown
// ones by name.
var ourParams = []string{"key_prefix"}

// openURL opens a driver for redis://[user:password@]host[:port][/db][?…]
// and rediss:// (TLS). See ParseURL for the parameters.
func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	opt, o, err := parseURL(u)
	if err != nil {
		return nil, dlock.BadURL("%v", err)
	}
	client := redis.NewClient(opt)
	d, err := New(client, o)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	d.own = true
	if err := client.Ping(ctx).Err(); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("redislock: cannot reach %s: %w", opt.Addr, scrub(err, u))
	}
	return d, nil
}

// parseURL splits u into go-redis options and driver options. Errors never
// contain the URL's password.
func parseURL(u *url.URL) (*redis.Options, *Options, error) {
	q := u.Query()
	o := &Options{}
	for _, p := range ourParams {
		if v, ok := q[p]; ok {
			switch p {
			case "key_prefix":
				o.KeyPrefix = v[len(v)-1]
				if o.KeyPrefix == "" {
					return nil, nil, errors.New("redislock: URL parameter key_prefix is empty")
				}
			}
			q.Del(p)
		}
	}
	retries := q.Has("max_retries")
	ru := *u
	ru.RawQuery = q.Encode()
	opt, err := redis.ParseURL(ru.String())
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			return nil, nil, fmt.Errorf("redislock: invalid URL: %v", scrub(uerr.Err, u))
		}
		return nil, nil, fmt.Errorf("redislock: invalid URL: %v", scrub(err, u))
	}
	opt.ContextTimeoutEnabled = true
	// One dial per attempt: a dead node should fail fast, not retry
	// until the node timeout.
	opt.DialerRetries = 1
	if !retries {
		// A retried script whose first reply was lost would run twice
		// (re-entering the lock); let dlock treat the outcome as unknown.
		opt.MaxRetries = -1
	}
	// Our servers are plain Redis; skip the maintenance-notification
	// handshake (and its log line on servers that do not know it).
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return opt, o, nil
}

// scrub removes u's secrets from err's text.
func scrub(err error, u *url.URL) error { return dlock.RedactError(err, u) }
