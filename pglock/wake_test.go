package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testwait"
)

// BenchmarkWakeFair reports wake-up latency, the re-take share under 8
// contenders and the longest wait with 9 (see sqltest.WakeFair). Run with
// -benchtime=50x or so: each run takes some 6s whatever b.N.
func BenchmarkWakeFair(b *testing.B) {
	sqltest.WakeFairModes(b, []string{"lease", "advisory"}, openMode)
}

// TestWakesOnRelease: in every mode a release wakes a waiter on another
// driver long before its next poll.
func TestWakesOnRelease(t *testing.T) {
	sqltest.WakesOnReleaseModes(t, []string{"lease", "advisory", "rowlock"}, openMode)
}

func openMode(tb testing.TB, mode string) sqltest.Open {
	return newTestHarness(tb, Mode(mode)).NewDriver
}

// TestReleaseWakesLongestWaiter: of one driver's subscribers to a name,
// each release notification wakes the one that subscribed first (the old
// code woke whichever the map gave first, so a waiter could be passed over
// again and again).
func TestReleaseWakesLongestWaiter(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeLease)
	d := h.openDriver(t)
	name := randomName("fifo")
	var subs []driver.Subscription
	for i := 0; i < 8; i++ {
		s, err := d.Subscribe(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		subs = append(subs, s)
	}
	// The listener wakes every subscriber once when its connection comes
	// up (a release may have been missed before); it records its PID after
	// that. Drain those wakes.
	testwait.Until(t, 10*time.Second, "listener up", func() bool {
		d.ln.mu.Lock()
		defer d.ln.mu.Unlock()
		return d.ln.pid != 0
	})
	for _, s := range subs {
		select {
		case <-s.C():
		default:
		}
	}
	for len(subs) > 0 {
		if _, err := h.admin.Exec(ctx, "SELECT pg_notify($1, $2)", d.channel, name); err != nil {
			t.Fatal(err)
		}
		select {
		case <-subs[0].C():
		case <-time.After(10 * time.Second):
			t.Fatal("the longest-waiting subscriber was not woken within 10s of the notification")
		}
		for i, s := range subs[1:] {
			select {
			case <-s.C():
				t.Fatalf("subscriber %d of %d woken instead of or besides the longest-waiting one", i+2, len(subs))
			default:
			}
		}
		_ = subs[0].Close()
		subs = subs[1:]
	}
}
