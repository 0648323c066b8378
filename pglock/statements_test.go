package pglock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
)

// countingTracer counts the statements sent on a pool's connections.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestAdvisoryStatements: in ModeAdvisory an acquire is one statement,
// granted or refused, on a name used before or not (the old code sent a
// second one to create a new name's row), and a release is one.
func TestAdvisoryStatements(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(pool, &Options{Mode: ModeAdvisory, Table: "dlock_test_statements"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Another driver on the same table, on a pool of its own: tokens are
	// comparable among the drivers of one table.
	otherPool, err := pgxpool.New(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer otherPool.Close()
	other, err := New(otherPool, &Options{Mode: ModeAdvisory, Table: "dlock_test_statements"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	req := func(name, owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: name, Owner: owner, TTL: 10 * time.Second}
	}
	// The schema is made on first use.
	warmName := randomName("warm")
	warm, err := d.TryAcquire(ctx, req(warmName, "o"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: warmName, Owner: "o", Token: warm.Token, TTL: 10 * time.Second, Handle: warm.Handle}); err != nil {
		t.Fatal(err)
	}
	count := func(what string, want int64, f func()) {
		t.Helper()
		before := tr.n.Load()
		f()
		if got := tr.n.Load() - before; got != want {
			t.Errorf("%s: %d statements, want %d", what, got, want)
		}
	}
	name := randomName("stmts")
	for _, use := range []string{"first use of the name", "name used before"} {
		var g driver.Grant
		count("acquire, "+use, 1, func() {
			if g, err = d.TryAcquire(ctx, req(name, "o")); err != nil {
				t.Fatal(err)
			}
		})
		count("release, "+use, 1, func() {
			if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g.Token, TTL: 10 * time.Second, Handle: g.Handle}); err != nil {
				t.Fatal(err)
			}
		})
	}
	held, err := other.TryAcquire(ctx, req(name, "x"))
	if err != nil {
		t.Fatal(err)
	}
	count("refused acquire", 1, func() {
		if _, err := d.TryAcquire(ctx, req(name, "o")); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("acquire of a name held elsewhere: %v, want ErrLocked", err)
		}
	})
	if _, err := other.Release(ctx, driver.Lease{Name: name, Owner: "x", Token: held.Token, TTL: 10 * time.Second, Handle: held.Handle}); err != nil {
		t.Fatal(err)
	}
	// Tokens keep growing across the two statements' paths.
	g1, err := d.TryAcquire(ctx, req(name, "o"))
	if err != nil {
		t.Fatal(err)
	}
	if g1.Token <= held.Token {
		t.Fatalf("token %d after %d", g1.Token, held.Token)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g1.Token, TTL: 10 * time.Second, Handle: g1.Handle}); err != nil {
		t.Fatal(err)
	}
}
