package mysqllock

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/dlock/dlock/driver"
)

// TestLeaseSignalSize: the per-lease signal record of ModeLease stays in
// the 48 B size class. It kept the signal's GET_LOCK name (a 64 B string
// made per grant, plus its 16 B header, 56 B in all) until the name was
// made only when a change is sent (signalOf).
func TestLeaseSignalSize(t *testing.T) {
	if n := unsafe.Sizeof(leaseSignal{}); n > 48 {
		t.Fatalf("leaseSignal is %d B, want at most 48", n)
	}
}

// sharesBytes reports whether s lies inside within's bytes.
func sharesBytes(s, within string) bool {
	p, q := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(within)))
	return p >= q && p+uintptr(len(s)) <= q+uintptr(len(within))
}

// TestHeldNameSharesKey: what a driver keeps of a held lock's name (the
// lease signals' map key in ModeLease, the hold in the session modes) is
// a slice of the grant's Key, not the caller's name string, so a name made
// for the one Lock is not kept alive per held lock.
func TestHeldNameSharesKey(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []Mode{ModeLease, ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			d, _ := benchDriver(t, mode)
			name := randomName("sharekey")
			req := driver.AcquireRequest{Name: string([]byte(name)), Owner: "o", TTL: 30 * time.Second}
			g, err := d.TryAcquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			var kept string
			if d.sess != nil {
				kept = d.sess.Get(name).Name()
			} else {
				d.leaseSig.mu.Lock()
				for key := range d.leaseSig.names {
					kept = key
				}
				d.leaseSig.mu.Unlock()
			}
			if !sharesBytes(kept, g.Key) {
				t.Errorf("the driver keeps the name %q apart from the grant's key %q", kept, g.Key)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: g.TTL}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
