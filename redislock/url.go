package redislock

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Scheme is the URL scheme this package registers with dlock, as does
// SchemeTLS: redis://[user:password@]host[:port][/db][?…].
const Scheme = "redis"

// SchemeTLS is the scheme of a Redis server reached over TLS.
const SchemeTLS = "rediss"

func init() {
	dlock.Register(Scheme, OpenURL)
	dlock.Register(SchemeTLS, OpenURL)
}

// ourParams are the URL query parameters that configure the driver; every
// other parameter goes to go-redis (redis.ParseURL), which refuses unknown
// ones by name.
var ourParams = []string{"key_prefix", "layout"}

// OpenURL opens a driver for redis://[user:password@]host[:port][/db][?…]
// or rediss:// (TLS) over a go-redis client of its own, which Close closes.
// The parameter key_prefix sets Options.KeyPrefix, layout (dlock or plain)
// Options.Layout, min_replicas and
// replica_timeout (a duration, e.g. 500ms) Options.MinReplicas and
// Options.ReplicaTimeout. TLS: rediss:// or
// tls=true; ca_file (PEM CAs to trust instead of the system's), cert_file
// and key_file (a client certificate, for servers with tls-auth-clients)
// and server_name (the name to verify instead of the host) each imply TLS,
// so a URL that names them never connects in plaintext. Every other
// parameter goes to go-redis (redis.ParseURL: pool_size, dial_timeout, …), which
// refuses unknown ones by name. The client gets ContextTimeoutEnabled, one
// dial per attempt and, unless max_retries is given, no retries (a script
// whose reply was lost must not run twice). A malformed URL or a bad value
// is refused with an error wrapping driver.ErrInvalid; a server that does
// not answer PING fails the open. No error carries the URL's password.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	opt, o, err := parseURL(u)
	if err != nil {
		return nil, openurl.BadURL("%w", err)
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
		return nil, fmt.Errorf("redislock: cannot reach %s: %w", opt.Addr, openurl.RedactError(err, u))
	}
	return d, nil
}

// takeOurParams moves the driver's own parameters (ourParams, min_replicas,
// replica_timeout) from q into o, for redis:// and redis-sentinel:// alike.
func takeOurParams(q url.Values, o *Options) error {
	for _, p := range ourParams {
		if v, ok := q[p]; ok {
			switch p {
			case "key_prefix":
				o.KeyPrefix = v[len(v)-1]
				if o.KeyPrefix == "" {
					return errors.New("redislock: URL parameter key_prefix is empty")
				}
			case "layout":
				o.Layout = v[len(v)-1]
				if o.Layout != LayoutDlock && o.Layout != LayoutPlain {
					return fmt.Errorf("redislock: URL parameter layout=%q: want %s or %s", o.Layout, LayoutDlock, LayoutPlain)
				}
			}
			q.Del(p)
		}
	}
	return takeReplicaParams(q, o)
}

// parseURL splits u into go-redis options and driver options. Errors never
// contain the URL's password.
func parseURL(u *url.URL) (*redis.Options, *Options, error) {
	q := u.Query()
	o := &Options{}
	if err := takeOurParams(q, o); err != nil {
		return nil, nil, err
	}
	tp, useTLS, err := openurl.TakeTLSOn(q)
	if err != nil {
		return nil, nil, fmt.Errorf("redislock: %w", err)
	}
	retries := q.Has("max_retries")
	ru := *u
	ru.RawQuery = q.Encode()
	if useTLS {
		ru.Scheme = SchemeTLS
	}
	opt, err := redis.ParseURL(ru.String())
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // its text is the whole URL, password included
		}
		return nil, nil, fmt.Errorf("redislock: invalid URL: %w", openurl.RedactError(err, u))
	}
	if opt.TLSConfig != nil {
		if err := tp.Apply(opt.TLSConfig); err != nil {
			return nil, nil, fmt.Errorf("redislock: %w", err)
		}
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
	// A lock's commands and replies are small: 4 KiB buffers rather than
	// go-redis's 32 KiB ones, which a pool grown to 20 connections keeps
	// as 1.3 MB.
	opt.ReadBufferSize, opt.WriteBufferSize = connBuffer, connBuffer
	return opt, o, nil
}

// connBuffer is the read and write buffer size of each connection of the
// clients OpenURL and OpenSentinelURL make.
const connBuffer = 4 << 10
