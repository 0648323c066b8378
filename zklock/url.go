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
)

func init() {
	dlock.Register("zk", OpenURL)
}

// OpenURL opens a driver from a URL of the form
//
//	zk://[user:password@]host1:2181,host2:2181[/root][?param=value&…]
//
// with its own connection, which the driver's Close closes (ending its
// session). The path is Options.Root (default DefaultRoot). User and
// password, when given, are added to the connection as digest auth.
// Parameters:
//
//	session_timeout  Options.SessionTimeout, asked of the server (a Go duration)
//	connect_timeout  how long Open waits for the first session (default 10s)
//	acl              open (default), creator or creator_read (see Options.ACL)
//
// dlock.Open calls it for the zk scheme. Errors never contain the password.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	servers, opts, auth, connectTimeout, err := parseURL(u)
	if err != nil {
		return nil, dlock.BadURL("%v", err)
	}
	conn, events, err := zk.Connect(servers, opts.SessionTimeout, zk.WithLogger(nopLogger{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("zklock: connect to %s: %w", strings.Join(servers, ","), err)
	}
	// Wait for the first session so that Open fails when no server answers.
	timer := time.NewTimer(connectTimeout)
	defer timer.Stop()
wait:
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				break wait
			}
			if ev.State == zk.StateAuthFailed {
				conn.Close()
				return nil, fmt.Errorf("zklock: connect to %s: authentication failed", strings.Join(servers, ","))
			}
		case <-timer.C:
			conn.Close()
			return nil, fmt.Errorf("zklock: connect to %s: no session within %v", strings.Join(servers, ","), connectTimeout)
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("zklock: connect to %s: %w", strings.Join(servers, ","), ctx.Err())
		}
	}
	go func() {
		for range events { // go-zookeeper drops events nobody reads; drain until Close
		}
	}()
	if auth != "" {
		if err := conn.AddAuth("digest", []byte(auth)); err != nil {
			conn.Close()
			return nil, fmt.Errorf("zklock: digest auth: %w", err)
		}
	}
	return newDriver(conn, true, opts)
}

func parseURL(u *url.URL) (servers []string, opts *Options, auth string, connectTimeout time.Duration, err error) {
	opts = &Options{SessionTimeout: DefaultSessionTimeout}
	connectTimeout = 10 * time.Second
	if u.Host == "" {
		return nil, nil, "", 0, errors.New("zklock: url has no hosts (want zk://host:2181[,host:2181…][/root])")
	}
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return nil, nil, "", 0, errors.New("zklock: url has an empty host in its host list")
		}
		if !strings.Contains(h, ":") {
			h += ":2181"
		}
		servers = append(servers, h)
	}
	if u.Path != "" {
		opts.Root = u.Path
		if err := checkRoot(opts.Root); err != nil {
			return nil, nil, "", 0, err
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
			return nil, nil, "", 0, fmt.Errorf("zklock: unknown url parameter %q (known: session_timeout, connect_timeout, acl)", k)
		}
		if perr != nil {
			return nil, nil, "", 0, fmt.Errorf("zklock: url parameter %s=%q: %v", k, v, perr)
		}
	}
	if opts.ACL != nil && auth == "" && opts.ACL[0].Scheme == "auth" {
		return nil, nil, "", 0, errors.New("zklock: url parameter acl=creator needs a user and password in the url")
	}
	return servers, opts, auth, connectTimeout, nil
}

// nopLogger silences go-zookeeper's connection logging.
type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}
