package pglock

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock"
)

// TestPlansFollowTableGrowth: a lock table that was analyzed while it held
// a dozen rows, and whose statements a connection has run often enough to
// keep generic plans for them (sequential reads, the cheaper plan at one
// page), grows to 3,000 names; Lock+Unlock of a name must then still read
// the table by its primary key, not row by row. Without the driver's
// ANALYZE on growth the 50 operations below read the whole table twice
// each (≈300,000 rows; 0.7 ms per statement at 10,000 rows, against 0.05).
// Autovacuum is off for the table, so that only the driver can refresh
// its statistics while the test runs.
func TestPlansFollowTableGrowth(t *testing.T) {
	ctx := context.Background()
	table := strings.ReplaceAll(strings.ToLower(randomName("dlock_grow")), "-", "_")
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // every statement on the one connection whose stats are flushed below
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	admin, err := pgx.Connect(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	d, err := New(pool, &Options{Mode: ModeLease, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(d, &dlock.Options{TTL: time.Minute})
	defer c.Close()
	defer admin.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	cycle := func(name string) {
		t.Helper()
		l, err := c.NewMutex(name, nil).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 {
		cycle(fmt.Sprintf("small-%d", i))
	}
	for _, q := range []string{"ALTER TABLE " + table + " SET (autovacuum_enabled = false)", "VACUUM ANALYZE " + table} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 { // past the five custom plans: the connection keeps generic ones
		cycle("probe")
	}
	for i := range 3000 {
		cycle(fmt.Sprintf("grown-%d", i))
	}
	d.grown.wg.Wait() // the driver's ANALYZEs run in the background
	var tuples float64
	if err := admin.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", table).Scan(&tuples); err != nil {
		t.Fatal(err)
	}
	t.Logf("statistics after the growth: %v rows", tuples)
	seqRead := func() int64 {
		t.Helper()
		// Flush the pool connection's table statistics, then read them.
		if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := admin.QueryRow(ctx, "SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relid = $1::regclass", table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := seqRead()
	const ops = 50
	for range ops {
		cycle("probe")
	}
	if read := seqRead() - before; read > ops*100 {
		t.Fatalf("%d Lock+Unlock of one name read %d rows sequentially (%d per operation) from a table of 3,012: its statements still run the plans made when it had 12 rows", ops, read, read/ops)
	}
	if n := analyzeErrs.Load(); n != 0 {
		t.Fatalf("%d ANALYZE(s) failed", n)
	}
}
