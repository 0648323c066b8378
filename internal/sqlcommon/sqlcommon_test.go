package sqlcommon

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCheckTable(t *testing.T) {
	for _, ok := range []string{"dlock_locks", "_t", "T1", strings.Repeat("a", MaxTableLen)} {
		if err := CheckTable(ok); err != nil {
			t.Errorf("CheckTable(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1t", "a-b", "a.b", "a b", `a"b`, "ä", "t;drop", strings.Repeat("a", MaxTableLen+1)} {
		if err := CheckTable(bad); err == nil {
			t.Errorf("CheckTable(%q) accepted", bad)
		}
	}
}

func TestMicros(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1}, {time.Microsecond, 1}, {1500 * time.Nanosecond, 2}, {time.Second, 1e6}} {
		if got := Micros(c.d); got != c.want {
			t.Errorf("Micros(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// TestPoolError: only a wait that ran out with every connection in use is
// reported as a full pool; any other cause is reported as itself, and the
// cause stays in the chain either way.
func TestPoolError(t *testing.T) {
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for _, tc := range []struct {
		err         error
		timedOut    bool
		inUse, size int
		full        bool
	}{
		{refused, false, 0, 32, false},
		{refused, false, 32, 32, false},                // failed at once, not a wait
		{context.DeadlineExceeded, true, 3, 32, false}, // a dial that hung
		{context.DeadlineExceeded, true, 0, 0, false},  // no limit: never "full"
		{context.DeadlineExceeded, true, 32, 32, true}, // the wait ran out on a full pool
	} {
		err := PoolError("x: pinning a connection", tc.err, tc.timedOut, tc.inUse, tc.size, "hint")
		if full := strings.Contains(err.Error(), "no free connection"); full != tc.full {
			t.Errorf("%+v: %q, want full=%v", tc, err, tc.full)
		}
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.err.Error()) {
			t.Errorf("%+v: %q does not carry the cause", tc, err)
		}
	}
}

func TestConfigure(t *testing.T) {
	c, err := Configure("x", "", "", "lease", "advisory", "rowlock")
	if err != nil || c.Mode != "lease" || c.Table != DefaultTable {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	if c, err := Configure("x", "rowlock", "t1", "lease", "advisory", "rowlock"); err != nil || c != (Config{"rowlock", "t1"}) {
		t.Fatalf("explicit: %+v %v", c, err)
	}
	if _, err := Configure("x", "bogus", "", "lease", "advisory", "rowlock"); err == nil || err.Error() != `x: unknown mode "bogus" (want lease, advisory or rowlock)` {
		t.Fatalf("unknown mode: %v", err)
	}
	if _, err := Configure("x", "", "t;drop", "lease"); err == nil || !strings.HasPrefix(err.Error(), "x: table name") {
		t.Fatalf("bad table: %v", err)
	}
}

func TestTakeParams(t *testing.T) {
	q := url.Values{"mode": {"rowlock"}, "table": {"t"}, "sslmode": {"require"}}
	mode, table, err := TakeParams("x", q)
	if err != nil || mode != "rowlock" || table != "t" || q.Encode() != "sslmode=require" {
		t.Fatalf("%q %q %v, rest %q", mode, table, err, q.Encode())
	}
	for _, p := range []string{"mode", "table"} {
		if _, _, err := TakeParams("x", url.Values{p: {""}}); err == nil || !strings.Contains(err.Error(), p+" is empty") {
			t.Fatalf("empty %s: %v", p, err)
		}
	}
}

// TestBase: the schema step runs until it succeeds once; a closed driver
// refuses calls before the schema or the Locker is reached; an empty Renew
// never reaches the Locker.
func TestBase(t *testing.T) {
	ctx := context.Background()
	calls, fail := 0, true
	s, f := newSessions(t)
	b := NewBase("x", s, func(context.Context) error {
		calls++
		if fail {
			return errors.New("no table")
		}
		return nil
	})
	if _, err := b.Renew(ctx, nil); err == nil || calls != 1 {
		t.Fatalf("failing schema: %v, %d calls", err, calls)
	}
	fail = false
	for i := 0; i < 2; i++ {
		if errs, err := b.Renew(ctx, nil); err != nil || errs != nil || calls != 2 {
			t.Fatalf("schema ready: %v %v, %d calls", errs, err, calls)
		}
	}
	f.pin = func(context.Context) (*fakeConn, error) { return &fakeConn{}, nil }
	f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return false, 0, nil }
	var le *driver.LockedError
	if _, err := b.TryAcquire(ctx, driver.AcquireRequest{Name: "n", Owner: "o"}); !errors.As(err, &le) {
		t.Fatalf("TryAcquire through Base: %v", err)
	}
	f.pin = nil
	b.Close()
	if _, err := b.TryAcquire(ctx, driver.AcquireRequest{Name: "n", Owner: "o"}); err == nil || !strings.Contains(err.Error(), "x: driver is closed") {
		t.Fatalf("TryAcquire after Close: %v", err)
	}
	if _, err := b.Release(ctx, driver.Lease{Name: "n", Owner: "o"}); err == nil {
		t.Fatal("Release after Close succeeded")
	}
}

func TestSettle(t *testing.T) {
	in := func() []driver.LockInfo {
		return []driver.LockInfo{
			{Name: "a", Owner: "o", Count: 2, ExpiresIn: time.Second},
			{Name: "b", Owner: "o", Count: 1, ExpiresIn: -time.Second},
		}
	}
	unexpired, _ := Unexpired(context.Background(), "", in())
	lease := Settle(in(), unexpired, false)
	if lease[0].Owner != "o" || lease[0].Count != 2 || lease[0].ExpiresIn != time.Second || lease[1] != (driver.LockInfo{Name: "b"}) {
		t.Fatalf("lease: %+v", lease)
	}
	sess := Settle(in(), []bool{false, true}, true)
	if sess[0] != (driver.LockInfo{Name: "a"}) || sess[1].Owner != "o" || sess[1].Count != 1 || sess[1].ExpiresIn != -1 {
		t.Fatalf("session: %+v", sess)
	}
}
