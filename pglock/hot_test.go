package pglock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
)

// TestRenewalKeepsTablesInPlace: renewing many held leases rewrites every
// row of the lock table (mutexes) and of <table>_holders (read locks), and
// those rewrites stay on their rows' pages (HOT updates, no new index
// entries), so a renewal tick does not grow the tables. With the tables
// packed full (fill factor 100, the old code) every renewed row moved to a
// new page and each renewal of n leases added about a table's worth of
// pages and n index entries.
func TestRenewalKeepsTablesInPlace(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const table = "dlock_test_hot"
	for _, s := range []string{table, table + "_kinds", table + "_holders"} {
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+s); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(pool, &Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const n = 400
	var ls []driver.Lease
	for i := 0; i < n; i++ {
		for _, kind := range []driver.Kind{driver.Exclusive, driver.Read} {
			req := driver.AcquireRequest{Name: fmt.Sprintf("hot/%s/%d-%d", randomName("r"), kind, i), Owner: "owner-hot", TTL: time.Minute, Kind: kind}
			g, err := d.TryAcquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, TTL: req.TTL, Kind: kind, Handle: g.Handle})
		}
	}
	sizes := func() (heap, index [2]int64) {
		t.Helper()
		for i, s := range []string{table, table + "_holders"} {
			if err := pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass), pg_indexes_size($1::regclass)", s).Scan(&heap[i], &index[i]); err != nil {
				t.Fatal(err)
			}
		}
		return heap, index
	}
	heap0, index0 := sizes()
	errs, err := d.Renew(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("renewing %s: %v", ls[i].Name, e)
		}
	}
	heap1, index1 := sizes()
	for i, s := range []string{table, table + "_holders"} {
		if heap1[i] > heap0[i] || index1[i] > index0[i] {
			t.Errorf("%s: one renewal of its %d rows grew it from %d to %d bytes (indexes %d to %d); want no growth",
				s, n, heap0[i], heap1[i], index0[i], index1[i])
		}
	}
}
