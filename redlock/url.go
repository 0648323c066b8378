package redlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/redisscript"
)

// Scheme is the URL scheme this package registers with dlock:
// redlock://[user:password@]h1:port,h2:port,…[/db][?…].
const Scheme = "redlock"

func init() {
	dlock.Register(Scheme, OpenURL)
}

// connBuffer is the read and write buffer size of each connection of the
// clients OpenURL makes.
const connBuffer = 4 << 10

// OpenURL opens a driver for redlock://[user:password@]h1:port,h2:port,…[/db][?…]
// over go-redis clients of its own, one per node, which Close closes.
// Parameters key_prefix and node_timeout set Options; tls=true connects
// with TLS (as rediss://), and so do ca_file (PEM CAs to trust instead of
// the system's), cert_file and key_file (a client certificate) and
// server_name (the name to verify instead of each node's host), which
// therefore never connect in plaintext; every other parameter goes to go-redis for each
// node, which refuses unknown ones by name. Each client gets
// ContextTimeoutEnabled, one dial per attempt, 4 KiB read and write
// buffers per connection and, unless max_retries is given, no retries. A malformed URL or a bad value is refused with an error
// wrapping driver.ErrInvalid; fewer than a quorum of nodes answering PING
// fails the open. No error carries the URL's password.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	opts, o, err := parseURL(u)
	if err != nil {
		return nil, openurl.BadURL("%w", err)
	}
	clients := make([]redis.UniversalClient, len(opts))
	for i, opt := range opts {
		clients[i] = redis.NewClient(opt)
	}
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	d, err := New(clients, o)
	if err != nil {
		closeAll()
		return nil, err
	}
	d.own = true
	// Refuse to start without a quorum: nothing could be granted.
	errs := redisscript.OnEach(clients, func(c redis.UniversalClient) error { return c.Ping(ctx).Err() })
	up := 0
	var down []string
	for i, err := range errs {
		if err == nil {
			up++
		} else {
			down = append(down, fmt.Sprintf("%s: %v", opts[i].Addr, openurl.RedactError(err, u)))
		}
	}
	if up < d.quorum {
		_ = d.Close()
		return nil, fmt.Errorf("redlock: only %d of %d nodes reachable, a quorum is %d (%s)", up, len(clients), d.quorum, strings.Join(down, "; "))
	}
	return d, nil
}

// parseURL splits u into one go-redis Options per node and the driver's
// Options. Errors never contain the URL's password.
func parseURL(u *url.URL) ([]*redis.Options, *Options, error) {
	if u.Host == "" {
		return nil, nil, errors.New("redlock: URL names no nodes (want redlock://h1:6379,h2:6379,h3:6379)")
	}
	q := u.Query()
	o := &Options{}
	scheme := "redis"
	if v, ok := q["key_prefix"]; ok {
		o.KeyPrefix = v[len(v)-1]
		if o.KeyPrefix == "" {
			return nil, nil, errors.New("redlock: URL parameter key_prefix is empty")
		}
		q.Del("key_prefix")
	}
	if v, ok := q["node_timeout"]; ok {
		t, err := time.ParseDuration(v[len(v)-1])
		if err != nil || t <= 0 {
			return nil, nil, fmt.Errorf("redlock: URL parameter node_timeout: want a positive duration such as 50ms, got %q", v[len(v)-1])
		}
		o.NodeTimeout = t
		q.Del("node_timeout")
	}
	tp, useTLS, err := openurl.TakeTLSOn(q)
	if err != nil {
		return nil, nil, fmt.Errorf("redlock: %w", err)
	}
	if useTLS {
		scheme = "rediss"
	}
	retries := q.Has("max_retries")
	seen := map[string]bool{}
	var opts []*redis.Options
	for _, host := range strings.Split(u.Host, ",") {
		if host == "" {
			return nil, nil, errors.New("redlock: URL has an empty node address")
		}
		nu := url.URL{Scheme: scheme, User: u.User, Host: host, Path: u.Path, RawQuery: q.Encode()}
		opt, err := redis.ParseURL(nu.String())
		if err != nil {
			var uerr *url.Error
			if errors.As(err, &uerr) {
				err = uerr.Err // its text is the whole URL, password included
			}
			return nil, nil, fmt.Errorf("redlock: invalid URL (node %s): %w", host, openurl.RedactError(err, u))
		}
		if seen[opt.Addr] {
			return nil, nil, fmt.Errorf("redlock: node %s is listed twice", opt.Addr)
		}
		seen[opt.Addr] = true
		if opt.TLSConfig != nil {
			if err := tp.Apply(opt.TLSConfig); err != nil {
				return nil, nil, fmt.Errorf("redlock: %w", err)
			}
		}
		opt.ContextTimeoutEnabled = true
		// One dial per attempt: a dead node should fail fast, not retry
		// until the node timeout.
		opt.DialerRetries = 1
		if !retries {
			opt.MaxRetries = -1
		}
		opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		// A lock's commands and replies are small: 4 KiB buffers rather
		// than go-redis's 32 KiB ones (a renewal batch is written and read
		// through them in pieces).
		opt.ReadBufferSize, opt.WriteBufferSize = connBuffer, connBuffer
		opts = append(opts, opt)
	}
	return opts, o, nil
}
