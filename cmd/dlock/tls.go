package main

import (
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/dlock/dlock/internal/openurl"
)

// How a backend URL's connection is protected, as "dlock status" and -v
// report it ("tls: none").
const (
	tlsLocal      = ""           // no network connection (sqlite, mem), or a scheme dlock cannot judge
	tlsNone       = "none"       // plaintext
	tlsUnverified = "unverified" // encrypted, but the server's certificate is not checked (or plaintext is allowed)
	tlsVerified   = "verified"   // encrypted, and the server's certificate checked
)

// tlsInfo tells from the URL alone how its connection is protected: one of
// the tls* states, and the setting that decides it. It reads the URL as the
// drivers do (docs/security.md), and $PGSSLMODE / $PGSSLROOTCERT for
// PostgreSQL, which pgx reads when the URL does not say. It opens nothing.
func tlsInfo(raw string, getenv func(string) string) (state, why string) {
	u, err := url.Parse(raw)
	if err != nil {
		return tlsLocal, ""
	}
	q := u.Query()
	on := q.Get("tls") == "true" || q.Get("tls") == "1" || slices.ContainsFunc(openurl.TLSParamNames, q.Has)
	switch u.Scheme {
	case "redis", "rediss", "redlock", "redis-sentinel":
		switch {
		case u.Scheme != "rediss" && !on:
			return tlsNone, u.Scheme + ":// without tls=true or ca_file"
		case q.Get("skip_verify") == "true" || q.Get("skip_verify") == "1":
			return tlsUnverified, "skip_verify=true"
		}
		return tlsVerified, ""
	case "etcd", "etcds", "zk", "zks":
		// etcd's endpoints=https://h1:2379,… asks for TLS as etcdctl's does.
		if strings.HasSuffix(u.Scheme, "s") || on || strings.Contains(q.Get("endpoints"), "https://") {
			return tlsVerified, ""
		}
		return tlsNone, u.Scheme + ":// without tls=true or ca_file"
	case "postgres", "postgresql":
		return pgTLS(q, getenv)
	case "mysql":
		return mysqlTLS(q)
	}
	return tlsLocal, ""
}

// pgTLS is tlsInfo for PostgreSQL: pgx's sslmode, whose default is prefer
// (TLS without verification, plaintext if the server has none), and
// verify-full when a TLS parameter of dlock's is given.
func pgTLS(q url.Values, getenv func(string) string) (state, why string) {
	mode, from := q.Get("sslmode"), "sslmode="
	if mode == "" && getenv("PGSSLMODE") != "" {
		mode, from = getenv("PGSSLMODE"), "$PGSSLMODE="
	}
	if mode == "" {
		if slices.ContainsFunc(openurl.TLSParamNames, q.Has) {
			return tlsVerified, ""
		}
		mode, from = "prefer", "sslmode=prefer, pgx's default"
	} else {
		from += mode
	}
	switch mode {
	case "disable", "allow":
		return tlsNone, from
	case "prefer":
		return tlsUnverified, from + ": the certificate is not checked, and plaintext is used if the server has no TLS"
	case "require":
		if q.Get("sslrootcert") == "" && q.Get("ca_file") == "" && getenv("PGSSLROOTCERT") == "" {
			return tlsUnverified, from + " without sslrootcert"
		}
		return tlsVerified, from + " with a CA: the host name is not checked"
	case "verify-ca":
		return tlsVerified, from + ": the host name is not checked"
	}
	return tlsVerified, ""
}

// mysqlTLS is tlsInfo for MySQL: go-sql-driver/mysql's tls parameter,
// plaintext without it, and verified TLS when a TLS parameter of dlock's is
// given.
func mysqlTLS(q url.Values) (state, why string) {
	switch v := q.Get("tls"); {
	case slices.ContainsFunc(openurl.TLSParamNames, q.Has):
		return tlsVerified, ""
	case v == "" || v == "false" || v == "0":
		return tlsNone, "mysql:// without tls=true or ca_file"
	case v == "skip-verify":
		return tlsUnverified, "tls=skip-verify"
	case v == "preferred":
		return tlsUnverified, "tls=preferred: the certificate is not checked, and plaintext is used if the server has no TLS"
	}
	return tlsVerified, ""
}

// tlsLine is "tls: STATE (WHY)", or "" for a local backend.
func tlsLine(raw string, getenv func(string) string) string {
	state, why := tlsInfo(raw, getenv)
	switch {
	case state == tlsLocal:
		return ""
	case why == "":
		return "tls: " + state
	}
	return "tls: " + state + " (" + why + ")"
}

// onLoopback reports whether every host the URL names is on this machine
// (localhost, a loopback address, or none: a Unix socket), where
// plaintext crosses no network.
func onLoopback(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	hosts := u.Host
	if eps := u.Query().Get("endpoints"); eps != "" {
		hosts = eps // etcd's endpoints=http://h1:2379,…
	}
	for _, hp := range strings.Split(hosts, ",") {
		if _, rest, ok := strings.Cut(hp, "://"); ok {
			hp = rest
		}
		h := hp
		if host, _, err := net.SplitHostPort(hp); err == nil {
			h = host
		}
		h = strings.Trim(h, "[]")
		if ip := net.ParseIP(h); h != "" && h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return true
}

// reportBackend prints, on stderr, the backend (its URL with secrets
// masked) and how its connection is protected when verbose; otherwise only
// a note when a connection over the network is not verified TLS.
func reportBackend(e *env, raw string, verbose bool) {
	line := tlsLine(raw, e.getenv)
	if verbose {
		shown := raw
		if u, err := url.Parse(raw); err == nil {
			shown = openurl.RedactURL(u)
		}
		if line == "" {
			line = "tls: not applicable (local)"
		}
		e.warnf("dlock: backend %s; %s", shown, line)
		return
	}
	if state, _ := tlsInfo(raw, e.getenv); (state == tlsNone || state == tlsUnverified) && !onLoopback(raw) {
		e.warnf("dlock: note: %s; see docs/security.md for verified TLS", line)
	}
}
