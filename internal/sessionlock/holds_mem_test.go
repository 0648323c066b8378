package sessionlock

import (
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/dlock/dlock/driver"
)

type memHandle struct{ _ [16]byte }

// A held lock costs Holds less than 80 bytes of heap at 10,000 holds: a
// 16-byte hash of (name, owner) and a 16-byte record by value in one map.
// Before, a map keyed by the two strings pointed to a record of its own:
// 98.9 B per hold.
func TestHoldsHeapPerHold(t *testing.T) {
	if s := unsafe.Sizeof(hold[*memHandle]{}) + unsafe.Sizeof(holdKey{}); s > 32 {
		t.Errorf("a hold's key and record are %d B, want at most 32", s)
	}
	const n = 10000
	names := make([]string, n)
	handles := make([]*memHandle, n)
	for i := range names {
		names[i] = fmt.Sprintf("name-%d", i)
		handles[i] = &memHandle{}
	}
	owner := "owner"
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	var hs Holds[*memHandle]
	for i := range names {
		hd := handles[i]
		if _, err := hs.Acquire(t.Context(), names[i], owner, true, "acquire", Ops[*memHandle]{
			Enqueue: func() (driver.Grant, error) { return driver.Grant{Handle: hd, Token: 1}, nil },
			Grant:   func(h *memHandle, _ int, _ time.Time) driver.Grant { return driver.Grant{Handle: h, Token: 1} },
		}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	per := (float64(ms.HeapAlloc) - float64(before)) / n
	runtime.KeepAlive(names)
	runtime.KeepAlive(handles)
	if got := hs.Count(names[n-1], owner, func(*memHandle) bool { return true }); got != 1 {
		t.Fatalf("Count = %d, want 1", got)
	}
	t.Logf("%.1f B per hold", per)
	if per > 80 {
		t.Fatalf("%.1f B of heap per hold at %d holds, want at most 80", per, n)
	}
}

// (name, owner) pairs that spell the same bytes run together get apart keys.
func TestHoldKeyUnambiguous(t *testing.T) {
	if keyOf("ab", "c") == keyOf("a", "bc") || keyOf("", "x") == keyOf("x", "") {
		t.Fatal("two pairs with the same concatenation share a key")
	}
	if a, b := "a", "b"; keyOf(a, b) != keyOf("a", "b") {
		t.Fatal("keyOf is not deterministic")
	}
}
