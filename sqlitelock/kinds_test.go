package sqlitelock

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// opener opens drivers on one database file, like separate processes.
func opener(t *testing.T) sqltest.Open {
	path := tempDB(t)
	return func(context.Context) (driver.Driver, error) { return Open(path, nil) }
}

func TestKinds(t *testing.T)     { sqltest.Kinds(t, opener(t)) }
func TestKindWakes(t *testing.T) { sqltest.KindWakes(t, opener(t)) }

func TestReadersWakeTogether(t *testing.T) { sqltest.ReadersWakeTogether(t, opener(t)) }

func TestWithdrawWakes(t *testing.T) { sqltest.WithdrawWakes(t, opener(t)) }
func TestMulti(t *testing.T)         { sqltest.Multi(t, opener(t)) }
func TestRaiseFence(t *testing.T) {
	sqltest.RaiseFence(t, opener(t))
}

// TestMigratesOldTable opens a file whose lock table an older version made
// (no fence_floor column, no kinds tables) twice: the schema is brought up
// to date in place, the old row keeps its fence, and the second open
// changes nothing.
func TestMigratesOldTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE "dlock_locks" (
	name        TEXT PRIMARY KEY NOT NULL,
	owner       TEXT NOT NULL DEFAULT '',
	count       INTEGER NOT NULL DEFAULT 0,
	fence       INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	lock_until  INTEGER NOT NULL,
	delay_until INTEGER NOT NULL
) WITHOUT ROWID`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO dlock_locks VALUES ('old', '', 0, 41, 0, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	ctx := context.Background()
	for i, want := range []uint64{42, 44} {
		d := openTest(t, path, nil)
		r := req("old", "a", time.Minute, 0)
		g := mustAcquire(t, d, r)
		if g.Token != want {
			t.Fatalf("open %d: token %d, want %d", i, g.Token, want)
		}
		if _, err := d.Release(ctx, lease("old", "a", g.Token, time.Minute, 0)); err != nil {
			t.Fatal(err)
		}
		if err := d.RaiseFence(ctx, "old", driver.Exclusive, g.Token+1); err != nil {
			t.Fatal(err)
		}
		rr := driver.AcquireRequest{Name: "old", Owner: "a", TTL: time.Minute, Kind: driver.Read}
		if _, err := d.TryAcquire(ctx, rr); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
}

// TestGrantKeys: every grant names its row (see sqlcommon.GrantKey).
func TestGrantKeys(t *testing.T) {
	sqltest.GrantKeys(t, opener(t), func(d driver.Driver) string { return d.(*Driver).name() })
}

func TestKindLockDelayInspect(t *testing.T) { sqltest.KindLockDelayInspect(t, opener(t)) }
