package redlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// openURL opens redlock://[user:password@]h1:port,h2:port,…[/db][?…].
// Parameters key_prefix and node_timeout set Options; tls=true connects
// with TLS (as rediss://); every other parameter goes to go-redis for each
// node, which refuses unknown ones by name. The URL's password is never put
// into an error.
func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	opts, o, err := parseURL(u)
	if err != nil {
		return nil, dlock.BadURL("%v", err)
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
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Ping(ctx).Err()
		}()
	}
	wg.Wait()
	up := 0
	var down []string
	for i, err := range errs {
		if err == nil {
			up++
		} else {
			down = append(down, fmt.Sprintf("%s: %v", opts[i].Addr, scrub(err, u)))
		}
	}
	if up < d.quorum {
		_ = d.Close()
		return nil, fmt.Errorf("redlock: only %d of %d nodes reachable, a quorum is %d (%s)", up, len(clients), d.quorum, strings.Join(down, "; "))
	}
	return d, nil
}

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
	if v, ok := q["tls"]; ok {
		switch v[len(v)-1] {
		case "true", "1":
			scheme = "rediss"
		case "false", "0":
		default:
			return nil, nil, fmt.Errorf("redlock: URL parameter tls: want true or false, got %q", v[len(v)-1])
		}
		q.Del("tls")
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
				err = uerr.Err
			}
			return nil, nil, fmt.Errorf("redlock: invalid URL (node %s): %v", host, scrub(err, u))
		}
		if seen[opt.Addr] {
			return nil, nil, fmt.Errorf("redlock: node %s is listed twice", opt.Addr)
		}
		seen[opt.Addr] = true
		opt.ContextTimeoutEnabled = true
		// One dial per attempt: a dead node should fail fast, not retry
		// until the node timeout.
		opt.DialerRetries = 1
		if !retries {
			opt.MaxRetries = -1
		}
		opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		opts = append(opts, opt)
	}
	return opts, o, nil
}

// scrub removes u's secrets from err's text.
func scrub(err error, u *url.URL) error { return dlock.RedactError(err, u) }
