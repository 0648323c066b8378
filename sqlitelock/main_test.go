package sqlitelock

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		// A child process of TestMultiProcess*: run only the helper and
		// skip leak checks (the child exits from inside the helper).
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
