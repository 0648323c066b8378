package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// DefaultDialTimeout bounds the connection attempt of a driver opened from a
// URL when dial_timeout is not given.
const DefaultDialTimeout = 5 * time.Second

// Scheme is the URL scheme this package registers with dlock.
const Scheme = "etcd"

// SchemeTLS is the scheme of an etcd cluster reached over TLS: etcd:// with
// tls=true.
const SchemeTLS = "etcds"

func init() {
	dlock.Register(Scheme, OpenURL)
	dlock.Register(SchemeTLS, OpenURL)
}

// OpenURL opens a driver from a URL of the form
//
//	etcd://[user:password@]host1:2379,host2:2379[/prefix][?param=value&…]
//
// with its own etcd client, which the driver's Close closes. The path after
// the hosts, without its leading '/', is Options.Prefix (write
// etcd://h//locks/ for the prefix "/locks/"). User and password, when given,
// authenticate with etcd's user/role auth. Parameters:
//
//	endpoints     the endpoints as etcdctl's --endpoints takes them, instead
//	              of hosts before the path: etcd:///prefix?endpoints=
//	              https://h1:2379,https://h2:2379 (https:// asks for TLS;
//	              http:// and https:// cannot be mixed)
//	session_ttl   Options.SessionTTL (a Go duration, e.g. 15s); deprecated:
//	              a lock's etcd lease has the lock's TTL, which dlock.Open
//	              takes from the ttl parameter (and MutexOptions.TTL)
//	dial_timeout  how long to wait for a connection (default 5s)
//	tls           true to use TLS with the system's roots (as etcds://)
//	ca_file       PEM file of the CA to trust (implies tls)
//	cert_file     PEM client certificate (with key_file; implies tls)
//	key_file      PEM client key
//	server_name   the name to verify in the server's certificate instead
//	              of the endpoint's host (implies tls)
//
// With TLS, Open first makes one TLS handshake with each endpoint (within
// dial_timeout), so that a wrong CA, a wrong server name or a missing client
// certificate fails Open with the handshake's reason when no endpoint
// accepts the handshake, not with gRPC's "context deadline exceeded".
//
// dlock.Open calls it for the etcd scheme. A malformed URL, or an unknown or
// bad parameter, is refused with an error naming it that wraps
// driver.ErrInvalid; a cluster that does not answer gives another error.
// Errors never contain the password.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	cfg, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	if cfg.TLS != nil {
		if err := probeTLS(ctx, cfg.Endpoints, cfg.TLS, cfg.DialTimeout); err != nil {
			return nil, fmt.Errorf("etcdlock: connect to %s: %w", strings.Join(cfg.Endpoints, ","), err)
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, connectError(ctx, cfg, u, err)
	}
	// Fail at Open rather than at the first lock when no member answers.
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, "\x00dlock-ping", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, connectError(ctx, cfg, u, err)
	}
	return newDriver(cli, true, opts)
}

// parseURL reads an etcd URL (see OpenURL). Its errors wrap
// driver.ErrInvalid.
func parseURL(u *url.URL) (clientv3.Config, *Options, error) {
	cfg := clientv3.Config{DialTimeout: DefaultDialTimeout, Logger: zap.NewNop()}
	opts := &Options{}
	if u.Scheme != Scheme && u.Scheme != SchemeTLS {
		return cfg, nil, openurl.BadURL("etcdlock: URL scheme is %q, want %q or %q", u.Scheme, Scheme, SchemeTLS)
	}
	q := u.Query()
	var httpsEndpoints bool
	if vs, ok := q["endpoints"]; ok {
		q.Del("endpoints")
		if u.Host != "" {
			return cfg, nil, openurl.BadURL("etcdlock: url names hosts both before the path and in endpoints; give one")
		}
		var err error
		cfg.Endpoints, httpsEndpoints, err = parseEndpoints(vs[len(vs)-1])
		if err != nil {
			return cfg, nil, err
		}
	} else {
		if u.Host == "" {
			return cfg, nil, openurl.BadURL("etcdlock: url has no hosts (want etcd://host:2379[,host:2379…][/prefix])")
		}
		for _, h := range strings.Split(u.Host, ",") {
			if h == "" {
				return cfg, nil, openurl.BadURL("etcdlock: url has an empty host in its host list")
			}
			if !strings.Contains(h, ":") {
				h += ":2379"
			}
			cfg.Endpoints = append(cfg.Endpoints, h)
		}
	}
	opts.Prefix = strings.TrimPrefix(u.Path, "/")
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	tp, useTLS, err := openurl.TakeTLSOn(q)
	if err != nil {
		return cfg, nil, openurl.BadURL("etcdlock: %w", err)
	}
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "session_ttl":
			opts.SessionTTL, err = time.ParseDuration(v)
			if err == nil && opts.SessionTTL <= 0 {
				err = errors.New("must be positive")
			}
		case "dial_timeout":
			cfg.DialTimeout, err = time.ParseDuration(v)
			if err == nil && cfg.DialTimeout <= 0 {
				err = errors.New("must be positive")
			}
		default:
			return cfg, nil, openurl.BadURL("etcdlock: unknown url parameter %q (known: session_ttl, dial_timeout, endpoints, tls, ca_file, cert_file, key_file, server_name)", k)
		}
		if err != nil {
			return cfg, nil, openurl.BadURL("etcdlock: url parameter %s=%q: %v", k, v, err)
		}
	}
	if useTLS || u.Scheme == SchemeTLS || httpsEndpoints {
		tc, err := tp.Config()
		if err != nil {
			return cfg, nil, openurl.BadURL("etcdlock: %w", err)
		}
		cfg.TLS = tc
		if tp.ServerName != "" {
			// gRPC verifies the name of its authority, the endpoint's
			// host, whatever the tls.Config says: make it the name.
			cfg.DialOptions = append(cfg.DialOptions, grpc.WithAuthority(tp.ServerName))
		}
	}
	return cfg, opts, nil
}
