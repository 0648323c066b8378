package acceptance

import (
	"path/filepath"
	"testing"
	"time"

	_ "github.com/dlock/dlock/sqlitelock"
)

func TestSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.db")
	runScenarios(t, backend{url: "sqlite://" + path, ttl: time.Second})
}
