package mysqllock

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dlock/dlock/driver"
)

// countingConn counts the writes of a connection: go-sql-driver/mysql
// sends a query in one.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestOneRoundTripLess: in ModeGetLock a grant is one query when the
// connections accept several statements (the GET_LOCK statement and the
// fence increment together), as those of a driver opened from a URL do,
// and two when they do not. It used to be two either way: three round
// trips per Lock+Unlock against the two of a hand-written GET_LOCK and
// RELEASE_LOCK, 1.53-1.57× its time in the peer harness. In ModeRowLock
// the session's settings and the locking read go together: three queries
// per grant (with the fence increment and the confirmation) instead of
// four.
func TestOneRoundTripLess(t *testing.T) {
	for _, tc := range []struct {
		mode         Mode
		multi, apart int64
	}{{ModeGetLock, 1, 2}, {ModeRowLock, 3, 4}} {
		t.Run(string(tc.mode), func(t *testing.T) { testRoundTrips(t, tc.mode, tc.multi, tc.apart) })
	}
}

// testRoundTrips checks that a grant in mode sends multi queries when the
// connections accept several statements, apart when they do not.
func testRoundTrips(t *testing.T, mode Mode, multi, apart int64) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("multiStatements=", on), func(t *testing.T) {
			cfg := serverConfig(t)
			cfg.MultiStatements = on
			var writes atomic.Int64
			cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				var d net.Dialer
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return countingConn{Conn: c, writes: &writes}, nil
			}
			conn, err := mysql.NewConnector(cfg)
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(conn)
			defer db.Close()
			d, err := New(db, &Options{Mode: mode, Table: "dlock_test_" + string(mode)})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			ctx := context.Background()
			r := driver.AcquireRequest{Name: fmt.Sprint("round-trips-", on), Owner: "o", TTL: time.Minute}
			// The first grant makes the table and a connection.
			for i := range 2 {
				before := writes.Load()
				g, err := d.TryAcquire(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				n := writes.Load() - before
				if _, err := d.Release(ctx, driver.Lease{Name: r.Name, Owner: r.Owner, Token: g.Token, Handle: g.Handle}); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					continue
				}
				want := apart
				if on {
					want = multi
				}
				if n != want {
					t.Fatalf("a grant sent %d queries, want %d", n, want)
				}
			}
		})
	}
}

// serverConfig is the go-sql-driver/mysql configuration of the test
// server's URL, for a *sql.DB of a test's own making.
func serverConfig(t *testing.T) *mysql.Config {
	t.Helper()
	u, err := url.Parse(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	_, dsn, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
