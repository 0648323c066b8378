package pglock

import (
	"os"
	"sync"
	"testing"

	"github.com/dlock/dlock/internal/testserver"
)

// One PostgreSQL server for the package's tests, started on first use by
// internal/testserver (or the one DLOCK_TEST_POSTGRES_URL names) and stopped
// by TestMain.
var (
	srvOnce sync.Once
	srv     *testserver.Server
	srvURL  string
	srvErr  error
)

// serverURL returns the URL of the PostgreSQL server the tests use.
func serverURL(t testing.TB) string {
	t.Helper()
	srvOnce.Do(func() {
		if u := os.Getenv("DLOCK_TEST_POSTGRES_URL"); u != "" {
			srvURL = u
			return
		}
		srv, srvErr = testserver.StartPostgres(nil)
		if srvErr == nil {
			srvURL = srv.URL()
		}
	})
	if srvErr != nil {
		t.Fatalf("starting PostgreSQL: %v", srvErr)
	}
	return srvURL
}

func stopServer() {
	if srv != nil {
		srv.Stop()
	}
}
