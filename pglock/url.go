package pglock

import (
	"context"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Scheme is the URL scheme this package registers with dlock, as does
// SchemeAlt: postgres://user:pass@host:5432/db?mode=lease&table=dlock_locks.
const Scheme = "postgres"

// SchemeAlt is the other spelling of Scheme that pgx accepts.
const SchemeAlt = "postgresql"

func init() {
	dlock.Register(Scheme, OpenURL)
	dlock.Register(SchemeAlt, OpenURL)
}

// urlMaxConns is the pool size of a driver opened from a URL without
// pool_max_conns: the session modes pin one connection per held lock.
const urlMaxConns = 32

// OpenURL opens the driver a postgres:// or postgresql:// URL describes
// (see the package doc): mode and table are Options; ca_file, cert_file,
// key_file and server_name, the TLS parameters every TLS-capable backend
// takes, become pgx's sslrootcert, sslcert, sslkey and a server name to
// verify, with sslmode=verify-full unless verify-ca is given; every other
// parameter goes to pgx. pgx's default sslmode is prefer: TLS without
// verification, falling back to plaintext. The driver owns the pool it opens (Close closes it) and has
// created its lock table when OpenURL returns. A malformed URL or a bad
// value is refused with an error wrapping driver.ErrInvalid; no error
// carries the URL's password.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	opts, rest, err := parseURL(u)
	if err != nil {
		return nil, openurl.BadURL("%w", openurl.RedactError(err, u))
	}
	q := rest.Query()
	serverName, err := takeTLS(q)
	if err != nil {
		return nil, openurl.BadURL("%w", err)
	}
	rest.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(rest.String())
	if err != nil {
		return nil, openurl.BadURL("%w", openurl.RedactError(fmt.Errorf("pglock: %w", err), u))
	}
	setServerName(&cfg.ConnConfig.Config, serverName)
	if !rest.Query().Has("pool_max_conns") {
		cfg.MaxConns = urlMaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, openurl.RedactError(fmt.Errorf("pglock: %w", err), u)
	}
	d, err := newDriver(pool, true, opts)
	if err != nil {
		pool.Close()
		return nil, openurl.BadURL("%w", err) // options from the URL
	}
	if err := d.base.Ready(ctx); err != nil {
		pool.Close()
		return nil, openurl.RedactError(err, u)
	}
	return d, nil
}

// parseURL takes this driver's parameters out of u and returns the options
// and the URL to hand to pgx.
func parseURL(u *url.URL) (*Options, *url.URL, error) {
	if u.Scheme != Scheme && u.Scheme != SchemeAlt {
		return nil, nil, fmt.Errorf("pglock: URL scheme %q, want %s or %s", u.Scheme, Scheme, SchemeAlt)
	}
	rest := *u
	q := rest.Query()
	mode, table, err := sqlcommon.TakeParams("pglock", q)
	if err != nil {
		return nil, nil, err
	}
	rest.RawQuery = q.Encode()
	return &Options{Mode: Mode(mode), Table: table}, &rest, nil
}
