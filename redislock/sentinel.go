package redislock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// SchemeSentinel is the URL scheme of a Sentinel-managed master, which this
// package registers with dlock:
// redis-sentinel://[user:password@]S1[:26379][,S2[:26379]…][/db]?master_name=NAME[&…].
const SchemeSentinel = "redis-sentinel"

// DefaultSentinelPort is the port of a sentinel address given without one.
const DefaultSentinelPort = "26379"

func init() {
	dlock.Register(SchemeSentinel, OpenSentinelURL)
}

// OpenSentinelURL opens a driver for
// redis-sentinel://[user:password@]S1[:port][,S2[:port]…][/db]?master_name=NAME
// over a go-redis failover client of its own (redis.NewFailoverClient),
// which Close closes. The hosts are sentinels (port 26379 when none is
// given); the user and password of the URL are the sentinels' (AUTH to each
// sentinel), and the parameters username and password are the master's.
// master_name, the name the sentinels monitor the master under, is
// required. The client asks the sentinels for the master, follows
// +switch-master announcements, and after a failover reaches the promoted
// replica: renewals, waiters' pub/sub and Inspect keep working once
// Sentinel has named it (calls during the failover fail, and dlock treats
// them as it treats any backend error).
//
// key_prefix, layout, min_replicas and replica_timeout are as for redis:// (see
// OpenURL and Options.MinReplicas). TLS to the sentinels and the data
// nodes: tls=true, or any of ca_file, cert_file, key_file and server_name;
// each connection verifies the host it dials unless server_name names the
// one name every certificate must carry. Every other parameter goes to
// go-redis (redis.ParseFailoverURL: dial_timeout, read_timeout, pool_size,
// addr for more sentinels, …), which refuses unknown ones by name. As for
// redis://, the client honours context deadlines, dials once per attempt
// and does not retry commands unless max_retries is given.
//
// A malformed URL or a bad value is refused with an error wrapping
// driver.ErrInvalid; a master the sentinels do not name, or that does not
// answer PING, fails the open. No error carries a password of the URL.
func OpenSentinelURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	fo, o, err := parseSentinelURL(u)
	if err != nil {
		return nil, openurl.BadURL("%w", err)
	}
	client := redis.NewFailoverClient(fo)
	d, err := New(client, o)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	d.own = true
	if err := client.Ping(ctx).Err(); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("redislock: cannot reach master %q through the sentinels %s: %w",
			fo.MasterName, strings.Join(fo.SentinelAddrs, ","), openurl.RedactError(err, u))
	}
	return d, nil
}

// parseSentinelURL splits u into go-redis failover options and driver
// options. Errors never contain the URL's passwords.
func parseSentinelURL(u *url.URL) (*redis.FailoverOptions, *Options, error) {
	if u.Opaque != "" || u.Host == "" {
		return nil, nil, errors.New("redislock: a redis-sentinel URL names its sentinels: redis-sentinel://host:port[,host:port…]/db?master_name=NAME")
	}
	var hosts []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return nil, nil, errors.New("redislock: empty sentinel address in the URL's host list")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), DefaultSentinelPort)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" || port == "" {
			return nil, nil, fmt.Errorf("redislock: sentinel address %q is not host[:port]", h)
		}
		hosts = append(hosts, h)
	}
	q := u.Query()
	o := &Options{}
	if err := takeOurParams(q, o); err != nil {
		return nil, nil, err
	}
	if q.Get("master_name") == "" {
		return nil, nil, errors.New("redislock: a redis-sentinel URL needs master_name, the name the sentinels monitor the master under")
	}
	tp, useTLS, err := openurl.TakeTLSOn(q)
	if err != nil {
		return nil, nil, fmt.Errorf("redislock: %w", err)
	}
	retries := q.Has("max_retries")
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	ru := url.URL{Scheme: "redis", User: u.User, Host: hosts[0], Path: u.Path, RawQuery: q.Encode()}
	if useTLS {
		ru.Scheme = "rediss" // go-redis then takes skip_verify
	}
	fo, err := redis.ParseFailoverURL(ru.String())
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // its text is the whole URL, passwords included
		}
		return nil, nil, fmt.Errorf("redislock: invalid URL: %w", openurl.RedactError(err, u))
	}
	if fo.TLSConfig != nil {
		if err := tp.Apply(fo.TLSConfig); err != nil {
			return nil, nil, fmt.Errorf("redislock: %w", err)
		}
		// One configuration serves every sentinel and data node: our
		// dialer verifies each against the host it dials (go-redis's would
		// verify all against the first sentinel's name).
		fo.Dialer = tlsDialer(fo.TLSConfig, tp.ServerName == "", fo.DialTimeout)
		fo.TLSConfig = nil
	}
	fo.ContextTimeoutEnabled = true
	fo.DialerRetries = 1 // see parseURL
	fo.ReadBufferSize, fo.WriteBufferSize = connBuffer, connBuffer
	if !retries {
		fo.MaxRetries = -1 // see parseURL
	}
	return fo, o, nil
}

// tlsDialer dials TLS with c, verifying the dialled host when perHost (one
// configuration serves every sentinel and data node, whose names differ).
func tlsDialer(c *tls.Config, perHost bool, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if timeout == 0 {
		timeout = 5 * time.Second // go-redis's default dial timeout
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		tc := c.Clone()
		if perHost {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			tc.ServerName = host
		}
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: tc}
		return d.DialContext(ctx, network, addr)
	}
}
