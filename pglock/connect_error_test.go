package pglock

import (
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// TestUnreachableServerSaysSo: a server that cannot be reached is reported
// as such, not as a failure of the first statement a driver sends.
func TestUnreachableServerSaysSo(t *testing.T) {
	sqltest.Unreachable(t, "postgres://dlock:pw@127.0.0.1:1/dlock?sslmode=disable", "reading server version", OpenURL)
}
