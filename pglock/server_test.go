package pglock

import (
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testserver"
)

// server is the PostgreSQL server for the package's tests, started on first
// use by internal/testserver (or the one DLOCK_TEST_POSTGRES_URL names) and
// stopped by TestMain.
var server = &sqltest.Server{
	Kind:  "PostgreSQL",
	Env:   "DLOCK_TEST_POSTGRES_URL",
	Start: func() (*testserver.Server, error) { return testserver.StartPostgres(nil) },
	// The examples read DATABASE_URL, as an application would.
	ExampleEnv: "DATABASE_URL",
}

// serverURL returns the URL of the PostgreSQL server the tests use.
func serverURL(t testing.TB) string { return server.URL(t) }
