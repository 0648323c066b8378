package pglock

import (
	"os"
	"testing"
)

// serverURL returns the URL of the PostgreSQL server the tests use.
func serverURL(t testing.TB) string {
	if u := os.Getenv("DLOCK_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}
