package zklock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// Scheme is the URL scheme this package registers with dlock.
const Scheme = "zk"

func init() {
	dlock.Register(Scheme, OpenURL)
}

// OpenURL opens a driver from a URL of the form
//
//	zk://[user:password@]host1:2181,host2:2181[/root][?param=value&…]
//
// with connections of its own, which the driver's Close closes (ending
// their sessions). The path is Options.Root (default DefaultRoot). User and
// password, when given, are added to every connection as digest auth.
//
// A lock's TTL is the timeout of the ZooKeeper session its node belongs to,
// so the driver keeps one connection (one session) per distinct TTL: the
// first lock with a TTL opens a connection asking for that session timeout.
// When the ensemble grants another timeout (it clamps every request to its
// minSessionTimeout and maxSessionTimeout), the lock is refused with an
// error wrapping driver.ErrInvalid that names those bounds; a TTL is never
// replaced by another. Open makes the first connection at once, with
// session_timeout, so that it fails when no server answers; that connection
// serves locks whose TTL equals the timeout the server granted it.
// Parameters:
//
//	session_timeout  the session timeout asked for the first connection (a Go duration, default 30s)
//	connect_timeout  how long Open waits for the first session (default 10s)
//	acl              creator (the default with a user and password), open (the
//	                 default without), or creator_read (see Options.ACL)
//	tls              true for TLS to each server's secureClientPort (as zks://)
//	ca_file          PEM file of the CA to trust (implies tls)
//	cert_file        PEM client certificate (with key_file; implies tls)
//	key_file         PEM client key
//	server_name      the name to verify in the servers' certificates instead
//	                 of each host (implies tls)
//	layout           kazoo (the default) or curator: how a mutex names its
//	                 queue node, to share locks with Python kazoo's Lock or
//	                 Apache Curator's InterProcessMutex (see Options.Layout)
//
// With TLS, Open first makes a TLS handshake with the servers, so that a
// wrong CA, a wrong server name or a refused client certificate fails with
// its reason. ZooKeeper accepts any digest password (a wrong one is another
// identity), so with a user and password Open reads the root's ACL and fails
// when it admits neither everyone nor this user and password.
//
// dlock.Open calls it for the zk scheme. A malformed URL, or an unknown or
// bad parameter, is refused with an error naming it that wraps
// driver.ErrInvalid; an ensemble that does not answer gives another error.
// Errors never contain the password.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	rest, tc, err := takeTLS(u)
	if err != nil {
		return nil, err
	}
	servers, opts, auth, connectTimeout, err := parseURL(rest)
	if err != nil {
		return nil, err
	}
	dl := &dialer{servers: servers, auth: auth, connectTimeout: connectTimeout, tls: tc}
	if tc != nil {
		if err := probe(ctx, servers, tc, connectTimeout); err != nil {
			return nil, fmt.Errorf("zklock: connect to %s: %w", strings.Join(servers, ","), err)
		}
	}
	// The first session is opened now, so that Open fails when no server
	// answers.
	first, got, err := dl.open(ctx, opts.SessionTimeout)
	if err != nil {
		if tc == nil && openurl.SpeaksTLS(ctx, servers) {
			err = fmt.Errorf("%w (the server speaks TLS: use zks://, tls=true or ca_file)", err)
		}
		return nil, openurl.RedactError(err, u)
	}
	root := opts.Root
	if root == "" {
		root = DefaultRoot
	}
	if err := checkCredentials(first.conn, root, auth); err != nil {
		first.close()
		return nil, openurl.RedactError(err, u)
	}
	d, err := newDialing(dl, first, msTimeout(opts.SessionTimeout), got, opts)
	if err != nil {
		first.close()
		return nil, err
	}
	return d, nil
}

// parseURL reads a zk URL (see OpenURL). Its errors wrap driver.ErrInvalid.
func parseURL(u *url.URL) (servers []string, opts *Options, auth string, connectTimeout time.Duration, err error) {
	opts = &Options{SessionTimeout: dlock.DefaultTTL}
	connectTimeout = 10 * time.Second
	if u.Scheme != Scheme {
		return nil, nil, "", 0, openurl.BadURL("zklock: URL scheme is %q, want %q", u.Scheme, Scheme)
	}
	if u.Host == "" {
		return nil, nil, "", 0, openurl.BadURL("zklock: url has no hosts (want zk://host:2181[,host:2181…][/root])")
	}
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return nil, nil, "", 0, openurl.BadURL("zklock: url has an empty host in its host list")
		}
		if !strings.Contains(h, ":") {
			h += ":2181"
		}
		servers = append(servers, h)
	}
	if u.Path != "" {
		opts.Root = u.Path
		if err := checkRoot(opts.Root); err != nil {
			return nil, nil, "", 0, openurl.BadURL("%w", err)
		}
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		auth = u.User.Username() + ":" + pw
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		var perr error
		switch k {
		case "session_timeout":
			opts.SessionTimeout, perr = time.ParseDuration(v)
			if perr == nil && opts.SessionTimeout <= 0 {
				perr = errors.New("must be positive")
			}
		case "connect_timeout":
			connectTimeout, perr = time.ParseDuration(v)
			if perr == nil && connectTimeout <= 0 {
				perr = errors.New("must be positive")
			}
		case "layout":
			if v != LayoutKazoo && v != LayoutCurator {
				perr = fmt.Errorf("want %s or %s", LayoutKazoo, LayoutCurator)
			}
			opts.Layout = v
		case "acl":
			switch v {
			case "open":
				opts.ACL = zk.WorldACL(zk.PermAll)
			case "creator":
				opts.ACL = zk.AuthACL(zk.PermAll)
			case "creator_read":
				opts.ACL = append(zk.AuthACL(zk.PermAll), zk.WorldACL(zk.PermRead)...)
			default:
				perr = errors.New("want open, creator or creator_read")
			}
		default:
			return nil, nil, "", 0, openurl.BadURL("zklock: unknown url parameter %q (known: session_timeout, connect_timeout, acl, layout)", k)
		}
		if perr != nil {
			return nil, nil, "", 0, openurl.BadURL("zklock: url parameter %s=%q: %v", k, v, perr)
		}
	}
	if opts.ACL != nil && auth == "" && opts.ACL[0].Scheme == "auth" {
		return nil, nil, "", 0, openurl.BadURL("zklock: url parameter acl=creator needs a user and password in the url")
	}
	if opts.ACL == nil && auth != "" {
		// Credentials given: nodes are the creator's, not everyone's.
		opts.ACL = zk.AuthACL(zk.PermAll)
	}
	return servers, opts, auth, connectTimeout, nil
}

// nopLogger silences go-zookeeper's connection logging.
type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}
