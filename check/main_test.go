package check

import (
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// crashEnv makes a test worker exit with status 3 after half a second.
const crashEnv = "DLOCK_CHECK_TEST_CRASH"

// TestMain runs the worker body when the test binary is started as a
// checker worker (runTest's WorkerCommand), and the tests otherwise.
func TestMain(m *testing.M) {
	if IsWorker() {
		if os.Getenv(crashEnv) != "" {
			// TestRunDetectsCrash: die abnormally once the workload runs.
			time.AfterFunc(500*time.Millisecond, func() { os.Exit(3) })
		}
		os.Exit(WorkerMain())
	}
	goleak.VerifyTestMain(m)
}
