package mysqllock

import (
	"os"
	"testing"
)

// serverURL returns the mysql:// URL of the server the tests use.
func serverURL(t testing.TB) string {
	if u := os.Getenv("DLOCK_TEST_MYSQL_URL"); u != "" {
		return u
	}
	return "mysql://root@127.0.0.1:3306/test"
}
