package sqlcommon

import (
	"errors"
	"net/url"
	"strings"
	"sync"
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

func TestRedact(t *testing.T) {
	u, _ := url.Parse("postgres://u:p%40ss%2Fw@h/db")
	inner := errors.New("dial u:p@ss/w@h failed; escaped p%40ss%2Fw")
	err := Redact(inner, u)
	if strings.Contains(err.Error(), "p@ss/w") || strings.Contains(err.Error(), "p%40ss%2Fw") {
		t.Fatalf("password left in %q", err)
	}
	if !errors.Is(err, inner) {
		t.Fatal("redacted error lost its chain")
	}
	plain := errors.New("no secret here")
	if Redact(plain, u) != plain {
		t.Fatal("an error without the password was rewrapped")
	}
	if Redact(nil, u) != nil {
		t.Fatal("nil became non-nil")
	}
}

func TestLost(t *testing.T) {
	l := NewLost()
	if l.Cause() != nil {
		t.Fatal("cause before close")
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); l.Close(SessionLost(nil)) }()
	}
	wg.Wait()
	<-l.C()
	if c := l.Cause(); !errors.Is(c, driver.ErrSessionLost) || !errors.Is(c, driver.ErrNotHeld) {
		t.Fatalf("cause %v", c)
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
