package redlock

import (
	"testing"

	"github.com/dlock/dlock/internal/redisscript/redistest"
)

// TestMain starts three redis-servers for the runnable examples
// (REDIS_ADDRS) and checks for leaked goroutines after the tests.
func TestMain(m *testing.M) { redistest.Main(m, 3) }
