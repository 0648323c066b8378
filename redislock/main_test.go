package redislock

import (
	"testing"

	"github.com/dlock/dlock/internal/redisscript/redistest"
)

// TestMain starts a redis-server for the runnable examples (REDIS_URL) and
// checks for leaked goroutines after the tests.
func TestMain(m *testing.M) { redistest.Main(m, 1) }
