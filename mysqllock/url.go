package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Scheme is the URL scheme this package registers with dlock:
// mysql://user:pass@host:3306/db?mode=lease&table=dlock_locks.
const Scheme = "mysql"

func init() { dlock.Register(Scheme, OpenURL) }

// maxURLConns is the connection limit of a *sql.DB opened from a URL.
const maxURLConns = 32

// OpenURL opens the driver a mysql:// URL describes (see the package doc):
// mode and table are Options; ca_file (PEM CAs to trust), cert_file and
// key_file (a client certificate) and server_name (the name to verify
// instead of the host) ask for verified TLS without plaintext fallback, as
// on every TLS-capable backend; every other parameter goes to
// go-sql-driver/mysql's DSN (tls=true verifies against the system's roots;
// without tls the connection is plaintext), except that multiStatements is
// always on: the pool runs only the driver's own statements, and the
// session modes save a round trip per grant with it. The port defaults to 3306; the database is
// required. The driver owns the *sql.DB it opens (Close closes it) and has
// created its lock table when OpenURL returns. A malformed URL or a bad
// value is refused with an error wrapping driver.ErrInvalid; no error
// carries the URL's password.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	rest, tc, err := takeTLS(u)
	if err != nil {
		return nil, openurl.BadURL("%w", err)
	}
	opts, dsn, err := parseURL(rest)
	if err != nil {
		return nil, openurl.BadURL("%w", openurl.RedactError(err, u))
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, openurl.BadURL("%w", openurl.RedactError(fmt.Errorf("mysqllock: %w", err), u))
	}
	if tc != nil {
		cfg.TLS = tc // verified, and no fallback to plaintext
	}
	// The driver's own statements only (see store.multi): ModeGetLock
	// takes the lock and increments the fence in one round trip.
	cfg.MultiStatements = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, openurl.RedactError(fmt.Errorf("mysqllock: %w", err), u)
	}
	db := sql.OpenDB(conn)
	// Bound the burst of many waiters polling at once; session modes pin one
	// connection per held lock, so this also bounds the locks a URL-opened
	// driver can hold at once. Pass your own *sql.DB to New for other limits.
	db.SetMaxOpenConns(maxURLConns)
	db.SetMaxIdleConns(8)
	d, err := newDriver(db, true, opts)
	if err != nil {
		_ = db.Close()
		return nil, openurl.BadURL("%w", err) // options from the URL
	}
	if err := d.base.Ready(ctx); err != nil {
		_ = db.Close()
		return nil, openurl.RedactError(err, u)
	}
	return d, nil
}

// parseURL converts a mysql:// URL into Options and a go-sql-driver/mysql
// DSN ("user:pass@tcp(host:port)/db?params"). The port defaults to 3306.
// mode and table are taken out; every other query parameter is passed on.
func parseURL(u *url.URL) (*Options, string, error) {
	if u.Scheme != Scheme {
		return nil, "", fmt.Errorf("mysqllock: URL scheme %q, want %s", u.Scheme, Scheme)
	}
	if u.Host == "" {
		return nil, "", errors.New("mysqllock: URL has no host")
	}
	q := u.Query()
	mode, table, err := sqlcommon.TakeParams("mysqllock", q)
	if err != nil {
		return nil, "", err
	}
	cfg := mysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(strings.Trim(u.Host, "[]"), "3306")
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return nil, "", errors.New("mysqllock: URL has no database (mysql://user@host:port/DATABASE)")
	}
	dsn := cfg.FormatDSN()
	if len(q) > 0 {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + q.Encode()
	}
	return &Options{Mode: Mode(mode), Table: table}, dsn, nil
}
