package dlock

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// A held Lease fits the 160-byte size class: what most leases never need
// lives in leaseExtra (64 bytes), made on demand (see BenchmarkHeapPerLease).
func TestLeaseSize(t *testing.T) {
	if s := unsafe.Sizeof(Lease{}); s > 160 {
		t.Fatalf("a Lease takes %d bytes, more than 160", s)
	}
	if s := unsafe.Sizeof(leaseExtra{}); s > 64 {
		t.Fatalf("a leaseExtra takes %d bytes, more than 64", s)
	}
}

// The lease heaps keep their order and every lease's position through any
// mix of adds, moves and removals, and give back their memory after a burst.
func TestLeaseHeapKeepsOrderAndPositions(t *testing.T) {
	for _, k := range []int{byRenew, byEarly, byDeadline} {
		testLeaseHeap(t, leaseHeap{k: k})
	}
}

func testLeaseHeap(t *testing.T, h leaseHeap) {
	rng := rand.New(rand.NewPCG(1, 2))
	ls := make([]*Lease, 2000)
	for i := range ls {
		ls[i] = &Lease{pos: [nHeaps]int32{-1, -1, -1}}
	}
	in := map[*Lease]bool{}
	check := func(step int) {
		t.Helper()
		if len(h.ls) != len(in) {
			t.Fatalf("step %d: heap holds %d leases, want %d", step, len(h.ls), len(in))
		}
		for i, l := range h.ls {
			if int(l.pos[h.k]) != i || !in[l] {
				t.Fatalf("step %d: lease at %d records position %d (in: %v)", step, i, l.pos[h.k], in[l])
			}
			if p := (i - 1) / 2; i > 0 && h.key(h.ls[p]) > h.key(l) {
				t.Fatalf("step %d: key %d at %d above key %d at %d", step, h.key(h.ls[p]), p, h.key(l), i)
			}
		}
		for _, l := range ls {
			if !in[l] && l.pos[h.k] != -1 {
				t.Fatalf("step %d: removed lease records position %d", step, l.pos[h.k])
			}
		}
	}
	for step := range 20000 {
		l := ls[rng.IntN(len(ls))]
		switch {
		case step > 15000: // drain
			h.remove(l)
			delete(in, l)
		case rng.IntN(3) == 0:
			h.remove(l)
			delete(in, l)
		default:
			at := rng.Int64N(1000)
			if h.k == byDeadline {
				l.validUntil = at
				h.fix(l)
			} else {
				h.set(l, at)
			}
			in[l] = true
		}
		if step%97 == 0 || step > 19900 {
			check(step)
		}
	}
	for len(h.ls) > 0 { // pop in order
		l := h.head()
		h.remove(l)
		delete(in, l)
		if n := h.head(); n != nil && h.key(n) < h.key(l) {
			t.Fatalf("popped %d before %d", h.key(l), h.key(n))
		}
	}
	check(-1)
	if cap(h.ls) > 64 {
		t.Fatalf("the empty heap keeps room for %d leases", cap(h.ls))
	}
}

// A generated owner, which every held lease keeps, takes 22 characters
// (the 24-byte size class), printable and valid as an explicit owner, and
// owners are distinct.
func TestGeneratedOwner(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		o := newOwner()
		if len(o) > 24 {
			t.Fatalf("a generated owner takes %d bytes (%q), more than 24", len(o), o)
		}
		if err := checkOwner(o); err != nil {
			t.Fatalf("generated owner %q: %v", o, err)
		}
		if seen[o] {
			t.Fatalf("owner %q generated twice", o)
		}
		seen[o] = true
	}
}
