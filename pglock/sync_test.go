package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
)

// TestReleaseCommitsAsync: in ModeLease a release's transaction commits
// with synchronous_commit = off (no WAL flush waited for), and a grant's
// with the server's synchronous setting, so a fencing token is durable
// before it is handed out. Deferred constraint triggers on the lock table
// and <table>_holders note, at each commit, the setting the committing
// transaction has.
func TestReleaseCommitsAsync(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const table = "dlock_test_sync"
	for _, s := range []string{table, table + "_kinds", table + "_holders", table + "_commits"} {
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+s+" CASCADE"); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(pool, &Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.base.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`CREATE TABLE ` + table + `_commits (seq serial, what text, sync text)`,
		// A grant leaves the row held (count > 0), the last release leaves
		// it free (count = 0, or the holder's row deleted).
		`CREATE OR REPLACE FUNCTION ` + table + `_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ` + table + `_commits (what, sync) VALUES (
		TG_TABLE_NAME || CASE WHEN TG_OP <> 'DELETE' AND NEW.count > 0 THEN ' grant' ELSE ' release' END,
		current_setting('synchronous_commit'));
	RETURN NULL;
END $$`,
		`CREATE CONSTRAINT TRIGGER note AFTER INSERT OR UPDATE OR DELETE ON ` + table + ` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + table + `_note()`,
		`CREATE CONSTRAINT TRIGGER note AFTER INSERT OR UPDATE OR DELETE ON ` + table + `_holders DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + table + `_note()`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var server string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&server); err != nil {
		t.Fatal(err)
	}
	if server == "off" {
		t.Skip("the server's synchronous_commit is off")
	}
	name := randomName("sync")
	// Twice each: the first grant of a name inserts its row, later ones
	// update it.
	for i := 0; i < 2; i++ {
		for _, kind := range []driver.Kind{driver.Exclusive, driver.Read} {
			req := driver.AcquireRequest{Name: name, Owner: "owner-sync", TTL: time.Minute, Kind: kind}
			g, err := d.TryAcquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: req.Owner, Token: g.Token, TTL: req.TTL, Kind: kind, Handle: g.Handle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows, err := pool.Query(ctx, `SELECT what, sync FROM `+table+`_commits ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]int{}
	for rows.Next() {
		var what, sync string
		if err := rows.Scan(&what, &sync); err != nil {
			t.Fatal(err)
		}
		seen[what]++
		release := what == table+" release" || what == table+"_holders release"
		if release && sync != "off" {
			t.Errorf("%s committed with synchronous_commit = %s; want off", what, sync)
		}
		if !release && sync != server {
			t.Errorf("%s committed with synchronous_commit = %s; want the server's %s", what, sync, server)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{table + " grant", table + " release", table + "_holders grant", table + "_holders release"} {
		if seen[what] == 0 {
			t.Errorf("no %s noted (noted: %v)", what, seen)
		}
	}
}
