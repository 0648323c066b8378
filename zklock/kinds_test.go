package zklock

import (
	"testing"

	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// TestKinds runs the read/write lock and semaphore tests shared with
// etcdlock.
func TestKinds(t *testing.T) { queuetest.RunKinds(t, backend(t)) }
