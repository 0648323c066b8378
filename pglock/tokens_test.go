package pglock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
)

// TestAdvisoryGrantWritesNoRow: in ModeAdvisory a grant draws its token
// from the table's sequences and writes nothing to the lock table: the
// name's row keeps its version (xmin) across grants to several owners,
// while the tokens still grow. The old code bumped the row's fence in
// every grant, a row update that cost more server time than the rest of a
// Lock+Unlock.
func TestAdvisoryGrantWritesNoRow(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeAdvisory)
	d := h.driver(t)
	name := randomName("norow")
	xmin := func() string {
		t.Helper()
		var x string
		if err := h.admin.QueryRow(ctx, `SELECT xmin::text FROM `+h.table+` WHERE name = $1`, name).Scan(&x); err != nil {
			t.Fatalf("reading the row of %s: %v", name, err)
		}
		return x
	}
	var last uint64
	var before string
	for i, owner := range []string{"a", "b", "a", "c", "c"} {
		g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: owner, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= last {
			t.Fatalf("grant %d: token %d after %d", i, g.Token, last)
		}
		last = g.Token
		if i == 0 {
			before = xmin() // the first use created the row
		} else if x := xmin(); x != before {
			t.Fatalf("grant %d rewrote the row of %s (xmin %s, was %s)", i, name, x, before)
		}
		if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: owner, Token: g.Token, TTL: 10 * time.Second, Handle: g.Handle}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdvisoryTokensAboveRowFences: a lock table made before the token
// sequences fenced each name in its row. The first driver that opens it
// in ModeAdvisory raises the token floor above every row's fence (and its
// fence_floor), so no token is handed out twice across the upgrade.
func TestAdvisoryTokensAboveRowFences(t *testing.T) {
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const table = "dlock_test_legacy_tokens"
	for _, s := range []string{
		`DROP TABLE IF EXISTS ` + table,
		`DROP SEQUENCE IF EXISTS ` + table + `_tokens`,
		`DROP SEQUENCE IF EXISTS ` + table + `_token_floor`,
		newQueries(table).createTable,
		`INSERT INTO ` + table + ` (name, fence) VALUES ('old', 500)`,
		`INSERT INTO ` + table + ` (name, fence, fence_floor) VALUES ('raised', 7, 900)`,
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	pool, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(pool, &Options{Mode: ModeAdvisory, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, name := range []string{"old", "raised", "new"} {
		g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= 900 {
			t.Fatalf("%s: token %d, want above the table's largest fence, 900", name, g.Token)
		}
		if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g.Token, TTL: 10 * time.Second, Handle: g.Handle}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdvisoryInspectOtherDriver: a hold made by another driver (another
// process, as far as the inspecting driver knows) is listed as held; from
// the holder's first renewal its owner and token are known too, read from
// the text of its renewal ping in pg_stat_activity. Before that, and on
// the code before the ping carried the hold's name, owner and token are
// unknown.
func TestAdvisoryInspectOtherDriver(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeAdvisory)
	holder, inspector := h.driver(t), h.driver(t)
	name := randomName("inspect")
	const owner = "it's-me\\"
	g, err := holder.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: owner, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lease := driver.Lease{Name: name, Owner: owner, Token: g.Token, TTL: 10 * time.Second, Handle: g.Handle}
	info := func() driver.LockInfo {
		t.Helper()
		infos, err := inspector.(driver.Inspector).Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Name != name || infos[0].Count < 1 {
			t.Fatalf("Inspect(%q) = %+v, want it held", name, infos)
		}
		return infos[0]
	}
	if in := info(); in.Owner != "" || in.Token != 0 {
		t.Fatalf("before the first renewal: owner %q token %d, want unknown", in.Owner, in.Token)
	}
	errs, err := holder.Renew(ctx, []driver.Lease{lease})
	if err != nil || errs[0] != nil {
		t.Fatalf("Renew: %v %v", err, errs)
	}
	if in := info(); in.Owner != owner || in.Token != g.Token {
		t.Fatalf("after a renewal: owner %q token %d, want %q and %d", in.Owner, in.Token, owner, g.Token)
	}
	if _, err := holder.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	infos, err := inspector.(driver.Inspector).Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Count != 0 || infos[0].Owner != "" {
		t.Fatalf("after the release: %+v, want it free", infos)
	}
}

func TestParseHoldMarker(t *testing.T) {
	for _, tc := range []struct {
		query, owner string
		token        uint64
		ok           bool
	}{
		{`SELECT set_config('idle_session_timeout', '30000', false), 'dlock hold 42 abc'::text`, "abc", 42, true},
		{`SELECT 'dlock hold 7 it''s'::text`, "it's", 7, true},
		{`SELECT 'dlock hold 7 a\b'`, `a\b`, 7, true},
		{`SELECT 'dlock hold x abc'`, "", 0, false},
		{`SELECT 'dlock hold 7 abc`, "", 0, false},
		{`SELECT 1`, "", 0, false},
		{``, "", 0, false},
	} {
		token, owner, ok := parseHoldMarker(tc.query)
		if ok != tc.ok || token != tc.token || owner != tc.owner {
			t.Errorf("parseHoldMarker(%q) = %d, %q, %v; want %d, %q, %v", tc.query, token, owner, ok, tc.token, tc.owner, tc.ok)
		}
	}
}

// driver opens a driver on h, closed when t ends.
func (h *harness) driver(t *testing.T) driver.Driver {
	t.Helper()
	d, err := h.NewDriver(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestAdvisoryRaiseRacingGrants: raises of the table's token floor made
// while other drivers take and give back locks of several names keep each
// name's tokens strictly increasing, and every grant that starts after a
// raise returned gets a token above that raise.
func TestAdvisoryRaiseRacingGrants(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeAdvisory)
	raiser := h.driver(t).(driver.FenceRaiser)
	names := []string{randomName("race-a"), randomName("race-b")}
	var raised atomic.Uint64 // the largest raise that has returned
	var lastMu sync.Mutex
	last := map[string]uint64{} // each name's last token
	stop := make(chan struct{})
	errs := make(chan error, 8)
	report := func(err error) { // keeps the first few; never blocks
		select {
		case errs <- err:
		default:
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		d := h.driver(t)
		name := names[w%len(names)]
		owner := fmt.Sprintf("w%d", w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				floor := raised.Load() // read before the grant starts
				g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: owner, TTL: 10 * time.Second})
				if errors.Is(err, driver.ErrLocked) {
					continue
				}
				if err != nil {
					report(err)
					return
				}
				if g.Token <= floor {
					report(fmt.Errorf("%s: token %d after a raise to %d had returned", name, g.Token, floor))
				}
				lastMu.Lock()
				if g.Token <= last[name] {
					report(fmt.Errorf("%s: token %d after %d", name, g.Token, last[name]))
				}
				last[name] = g.Token
				lastMu.Unlock()
				if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: owner, Token: g.Token, TTL: 10 * time.Second, Handle: g.Handle}); err != nil {
					report(err)
					return
				}
			}
		}()
	}
	for i := 1; i <= 30; i++ {
		to := uint64(i) * 1000
		if err := raiser.RaiseFence(ctx, names[i%len(names)], driver.Exclusive, to); err != nil {
			t.Fatal(err)
		}
		raised.Store(to)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A grant after the last raise, of each name.
	for _, name := range names {
		g, err := raiser.(driver.Driver).TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "after", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= 30000 || g.Token <= last[name] {
			t.Errorf("%s: token %d after the last raise (30000) and the last grant (%d)", name, g.Token, last[name])
		}
	}
}
