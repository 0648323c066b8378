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

// TestPlansFollowTableGrowth: tables that were analyzed while they held a
// dozen rows, and whose statements the pool's connections have run often
// enough to keep generic plans for them (sequential reads, the cheaper plan
// at one page), grow to 3,000 names (or holds); taking and releasing one
// name must then still read them by primary key, not row by row. It runs
// for each table the driver looks rows up in by key: the lock table (lease
// mutexes), <table>_rowlock (ModeRowLock), and <table>_kinds and
// <table>_holders (lease-mode read locks, grown by holding them). Without
// the driver's ANALYZE on growth the 50 operations below read the grown
// tables whole, about 3,000 rows per statement (0.7 ms per statement at
// 10,000 rows, against 0.05). Autovacuum is off for the tables, so that
// only the driver can refresh their statistics while the test runs.
func TestPlansFollowTableGrowth(t *testing.T) {
	cases := []struct {
		name   string
		mode   Mode
		tables []string // suffixes of the tables that grow
		conns  int32
		read   bool // read locks, held while the tables grow
	}{
		{"lease mutex", ModeLease, []string{""}, 1, false},
		{"rowlock mutex", ModeRowLock, []string{"_rowlock"}, 2, false},
		{"lease read lock", ModeLease, []string{"_kinds", "_holders"}, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			planGrowth(t, tc.mode, tc.tables, tc.conns, tc.read)
		})
	}
}

func planGrowth(t *testing.T, mode Mode, suffixes []string, conns int32, read bool) {
	ctx := context.Background()
	table := strings.ReplaceAll(strings.ToLower(randomName("dlock_grow")), "-", "_")
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// As few connections as the mode needs, all of them flushed below.
	cfg.MaxConns = conns
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
	d, err := New(pool, &Options{Mode: mode, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(d, &dlock.Options{TTL: time.Minute})
	defer c.Close()
	defer func() {
		for _, s := range []string{"", "_kinds", "_holders", "_rowlock", "_tokens", "_token_floor"} {
			admin.Exec(ctx, "DROP TABLE IF EXISTS "+table+s)
		}
	}()
	var held []*dlock.Lease
	take := func(name string, keep bool) {
		t.Helper()
		var l *dlock.Lease
		var err error
		if read {
			l, err = c.NewRWMutex(name, nil).TryRLock(ctx)
		} else {
			l, err = c.NewMutex(name, nil).TryLock(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if keep {
			held = append(held, l)
			return
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 {
		take(fmt.Sprintf("small-%d", i), read)
	}
	for _, s := range suffixes {
		for _, q := range []string{"ALTER TABLE " + table + s + " SET (autovacuum_enabled = false)", "VACUUM ANALYZE " + table + s} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 10 { // past the five custom plans: the connections keep generic ones
		take("probe", false)
	}
	if mode == ModeRowLock {
		// The pinned connection can be either of the two, and a later
		// Lock may pin the one that ran only the fence's statements so
		// far: have each keep a generic plan of the row lock's.
		for _, pc := range pool.AcquireAllIdle(ctx) {
			for range 10 {
				b := &pgx.Batch{}
				b.Queue("BEGIN")
				b.Queue(d.q.rowLock, "probe", "60000")
				b.Queue("ROLLBACK")
				if err := pc.SendBatch(ctx, b).Close(); err != nil {
					t.Fatal(err)
				}
			}
			pc.Release()
		}
	}
	for i := range 3000 {
		take(fmt.Sprintf("grown-%d", i), read)
	}
	d.grown.wg.Wait() // the driver's ANALYZEs run in the background
	for _, s := range suffixes {
		var tuples float64
		if err := admin.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", table+s).Scan(&tuples); err != nil {
			t.Fatal(err)
		}
		t.Logf("statistics of %s after the growth: %v rows", table+s, tuples)
	}
	seqRead := func() int64 {
		t.Helper()
		// Flush every pool connection's table statistics, then read them.
		for _, pc := range pool.AcquireAllIdle(ctx) {
			for _, q := range []string{"SELECT pg_stat_force_next_flush()", "SELECT 1"} {
				if _, err := pc.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			pc.Release()
		}
		var sum int64
		for _, s := range suffixes {
			var n int64
			if err := admin.QueryRow(ctx, "SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relid = $1::regclass", table+s).Scan(&n); err != nil {
				t.Fatal(err)
			}
			sum += n
		}
		return sum
	}
	before := seqRead()
	const ops = 50
	for range ops {
		take("probe", false)
	}
	scanned := seqRead() - before
	t.Logf("%d acquire+release read %d rows sequentially", ops, scanned)
	if scanned > ops*100 {
		t.Fatalf("%d acquire+release of one name read %d rows sequentially (%d per operation) from %s%v grown to 3,000 rows: its statements still run the plans made when it had 12", ops, scanned, scanned/ops, table, suffixes)
	}
	if n := analyzeErrs.Load(); n != 0 {
		t.Fatalf("%d ANALYZE(s) failed", n)
	}
	for _, l := range held {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
