package acceptance

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(m.Run()) // a worker process: no leak check on os.Exit paths
	}
	goleak.VerifyTestMain(m)
}
