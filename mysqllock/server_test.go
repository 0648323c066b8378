package mysqllock

import (
	"net/url"
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testserver"
)

// server is the MariaDB server for the package's tests, started on first
// use by internal/testserver (or the one DLOCK_TEST_MYSQL_URL names) and
// stopped by TestMain.
var server = &sqltest.Server{
	Kind:  "MariaDB",
	Env:   "DLOCK_TEST_MYSQL_URL",
	Start: func() (*testserver.Server, error) { return testserver.StartMariaDB(nil) },
	// The examples read MYSQL_DSN, as an application would.
	ExampleEnv: "MYSQL_DSN",
	ExampleValue: func(raw string) (string, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return "", err
		}
		_, dsn, err := parseURL(u)
		return dsn, err
	},
}

// serverURL returns the URL of the MariaDB server the tests use.
func serverURL(t testing.TB) string { return server.URL(t) }
