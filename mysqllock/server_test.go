package mysqllock

import (
	"os"
	"sync"
	"testing"

	"github.com/dlock/dlock/internal/testserver"
)

// One MariaDB server for the package's tests, started on first use by
// internal/testserver (or the one DLOCK_TEST_MYSQL_URL names) and stopped
// by TestMain.
var (
	srvOnce sync.Once
	srv     *testserver.Server
	srvURL  string
	srvErr  error
)

// serverURL returns the URL of the MariaDB server the tests use.
func serverURL(t testing.TB) string {
	t.Helper()
	srvOnce.Do(func() {
		if u := os.Getenv("DLOCK_TEST_MYSQL_URL"); u != "" {
			srvURL = u
			return
		}
		srv, srvErr = testserver.StartMariaDB(nil)
		if srvErr == nil {
			srvURL = srv.URL()
		}
	})
	if srvErr != nil {
		t.Fatalf("starting MariaDB: %v", srvErr)
	}
	return srvURL
}

func stopServer() {
	if srv != nil {
		srv.Stop()
	}
}
