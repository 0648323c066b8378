package mysqllock

import (
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testwait"
)

// BenchmarkUncontended is TryLock+Unlock through a Client on one name,
// alone, in each mode. Run under strace to count the Go netpoller's
// wake-ups (8-byte eventfd writes) per op:
//
//	go test -c -o mysqllock.test ./mysqllock
//	strace -f -e trace=write ./mysqllock.test -test.run XXX -test.bench 'Uncontended/getlock' -test.benchtime 300x 2>&1 | grep -c '"\\1\\0\\0\\0\\0\\0\\0\\0", 8'
func BenchmarkUncontended(b *testing.B) {
	sqltest.Uncontended(b, []string{"lease", "getlock", "rowlock"}, func(b *testing.B, mode string) *dlock.Client {
		_, c := benchDriver(b, Mode(mode))
		return c
	})
}

// TestLeaseSignalNoTimer: an uncontended lease grant and its release
// within signalDelay make no timer of their own: the grant costs its
// signal record alone (1 allocation, the delayed list's growth aside),
// where a time.AfterFunc per grant (its Timer and the function it runs)
// armed a runtime timer on every acquire, which woke the Go netpoller.
// A stream of them arms the one shared timer about once per signalDelay
// at most; a lease held past signalDelay still has its signal wanted.
func TestLeaseSignalNoTimer(t *testing.T) {
	d, _ := benchDriver(t, ModeLease)
	sig := d.leaseSig
	name := randomName("signaltimer")
	cycle := func() {
		sig.grant(name, "o", false)
		if gone := sig.released(name, "o"); gone != nil {
			t.Fatal("a signal never sent is waited for at release")
		}
	}
	cycle()
	if allocs := testing.AllocsPerRun(1000, cycle); allocs > 1 {
		t.Fatalf("an uncontended grant and release take %v allocations, want at most 1 (no timer per grant)", allocs)
	}
	// A lease held past signalDelay has its signal wanted.
	held := randomName("signaltimer")
	sig.grant(held, "o", false)
	testwait.Until(t, 10*time.Second, "the held lease's signal to be wanted", func() bool {
		sig.mu.Lock()
		defer sig.mu.Unlock()
		e := sig.names[held]
		return e != nil && e.want
	})
	if gone := sig.released(held, "o"); gone != nil {
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			t.Fatal("the held lease's signal was never given up")
		}
	}
}
