package zklock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/openurl"
)

// SchemeTLS is the scheme of a ZooKeeper ensemble reached over TLS (its
// secureClientPort): zk:// with tls=true.
const SchemeTLS = "zks"

func init() {
	dlock.Register(SchemeTLS, OpenURL)
}

// takeTLS takes the TLS parameters every backend shares (tls, ca_file,
// cert_file, key_file, server_name) out of u and returns u without them,
// with the zk scheme, and the TLS configuration they describe (nil for
// plaintext). zks:// asks for TLS as tls=true does.
func takeTLS(u *url.URL) (*url.URL, *tls.Config, error) {
	rest := *u
	if u.Scheme != SchemeTLS && u.Scheme != Scheme {
		return nil, nil, openurl.BadURL("zklock: URL scheme is %q, want %q or %q", u.Scheme, Scheme, SchemeTLS)
	}
	q := u.Query()
	tp, on, err := openurl.TakeTLSOn(q)
	if err != nil {
		return nil, nil, openurl.BadURL("zklock: %w", err)
	}
	rest.Scheme = Scheme
	rest.RawQuery = q.Encode()
	if !on && u.Scheme != SchemeTLS {
		return &rest, nil, nil
	}
	tc, err := tp.Config()
	if err != nil {
		return nil, nil, openurl.BadURL("zklock: %w", err)
	}
	return &rest, tc, nil
}

// dialTLS dials addr and, when cfg is not nil, makes a TLS handshake with
// cfg within timeout, verifying the server's host unless cfg names a
// server. The driver's connection tracker reads the session timeouts from
// the connection it returns, so TLS sits under it.
func dialTLS(network, addr string, timeout time.Duration, cfg *tls.Config) (net.Conn, error) {
	raw, err := net.DialTimeout(network, addr, timeout)
	if err != nil || cfg == nil {
		return raw, err
	}
	c := cfg
	if c.ServerName == "" {
		c = cfg.Clone()
		c.ServerName, _, _ = net.SplitHostPort(addr)
	}
	tc := tls.Client(raw, c)
	_ = raw.SetDeadline(time.Now().Add(timeout))
	if err := tc.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return tc, nil
}

// checkCredentials fails when the digest credentials auth ("user:password")
// cannot create nodes under root: ZooKeeper accepts any digest password
// (a wrong one is just another identity), so a wrong password shows only as
// a root whose ACL admits neither everyone nor this identity. A root that
// does not exist yet proves nothing and passes.
func checkCredentials(conn *zk.Conn, root, auth string) error {
	if auth == "" {
		return nil
	}
	acl, _, err := conn.GetACL(root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	user, pw, _ := strings.Cut(auth, ":")
	if errors.Is(err, zk.ErrNoAuth) {
		return fmt.Errorf("zklock: user %q may not read the ACL of %s: wrong password, or another user's root", user, root)
	}
	if err != nil {
		return fmt.Errorf("zklock: reading the ACL of %s: %w", root, err)
	}
	me := zk.DigestACL(zk.PermAll, user, pw)[0].ID
	for _, a := range acl {
		if a.Perms&zk.PermCreate == 0 {
			continue
		}
		if (a.Scheme == "world" && a.ID == "anyone") || (a.Scheme == "digest" && a.ID == me) {
			return nil
		}
	}
	return fmt.Errorf("zklock: user %q may not create nodes under %s (its ACL admits other identities): wrong password?", user, root)
}

// probe makes a TLS handshake with the servers so that a wrong CA, a wrong
// server name or a refused client certificate fails Open with its reason,
// not with "no session within" the connect timeout.
func probe(ctx context.Context, servers []string, cfg *tls.Config, timeout time.Duration) error {
	return openurl.ProbeTLS(ctx, servers, cfg, nil, timeout)
}
