package mysqllock

import (
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
}

// serverURL returns the URL of the MariaDB server the tests use.
func serverURL(t testing.TB) string { return server.URL(t) }
