package pglock

import (
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock/dlock/internal/openurl"
)

// takeTLS rewrites the TLS parameters every backend shares (ca_file,
// cert_file, key_file, server_name) in q into pgx's: sslrootcert, sslcert,
// sslkey and, unless sslmode says verify-ca or verify-full, sslmode=
// verify-full. They ask for verified TLS, so sslmode=disable, allow, prefer
// or require with them is refused. It returns the server name to verify,
// "" when not given.
func takeTLS(q url.Values) (string, error) {
	tp, err := openurl.TakeTLS(q)
	if err != nil {
		return "", fmt.Errorf("pglock: %w", err)
	}
	if !tp.Any() {
		return "", nil
	}
	// server_name has no pgx name; it is set on the parsed configuration.
	for _, m := range []struct{ ours, theirs, v string }{
		{"ca_file", "sslrootcert", tp.CAFile},
		{"cert_file", "sslcert", tp.CertFile},
		{"key_file", "sslkey", tp.KeyFile},
	} {
		if m.v == "" {
			continue
		}
		if q.Has(m.theirs) {
			return "", openurl.BadURL("pglock: URL parameters %s and %s name the same file; give one", m.ours, m.theirs)
		}
		q.Set(m.theirs, m.v)
	}
	switch m := q.Get("sslmode"); m {
	case "":
		q.Set("sslmode", "verify-full")
	case "verify-ca", "verify-full":
	default:
		return "", openurl.BadURL("pglock: URL parameter sslmode=%s contradicts ca_file, cert_file, key_file or server_name (which ask for verified TLS: verify-full, the default with them, or verify-ca)", m)
	}
	return tp.ServerName, nil
}

// setServerName makes every TLS configuration of cfg verify name instead of
// the host dialled.
func setServerName(cfg *pgconn.Config, name string) {
	if name == "" {
		return
	}
	if cfg.TLSConfig != nil {
		cfg.TLSConfig.ServerName = name
	}
	for _, f := range cfg.Fallbacks {
		if f.TLSConfig != nil {
			f.TLSConfig.ServerName = name
		}
	}
}
