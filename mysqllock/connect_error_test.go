package mysqllock

import (
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// TestUnreachableServerSaysSo: a server that cannot be reached is reported
// as such, not as a failure to create the lock table (the first statement
// a driver sends).
func TestUnreachableServerSaysSo(t *testing.T) {
	sqltest.Unreachable(t, "mysql://dlock:pw@127.0.0.1:1/dlock", "creating lock table", OpenURL)
}
