package etcdlock

import (
	"testing"
	"unsafe"

	"github.com/dlock/dlock/driver"
)

// TestSlots: a name's slots are the lowest free ones, past 64 too, and the
// name is forgotten once every slot is free again.
func TestSlots(t *testing.T) {
	d := &Driver{prefix: "p/"}
	s := &session{prefixLen: len(d.prefix)}
	const n = 150
	a := make([]*handle, 0, n+1)
	for i := range uint32(n) {
		h := d.newHandle(driver.Exclusive, "a", s)
		if h.slot != i {
			t.Fatalf("take %d: slot %d", i, h.slot)
		}
		if h.name() != "a" || h.slotName() != "a" {
			t.Fatalf("take %d: name %q, slot name %q", i, h.name(), h.slotName())
		}
		a = append(a, h)
	}
	b := d.newHandle(driver.Exclusive, "b", s)
	if b.slot != 0 {
		t.Fatalf("another name: slot %d, want 0", b.slot)
	}
	w := d.newHandle(driver.Write, "a", s)
	if w.slot != 0 || w.name() != "a" {
		t.Fatalf("another kind: slot %d, name %q, want 0, %q", w.slot, w.name(), "a")
	}
	for _, k := range []uint32{100, 3, 70, 64} {
		s.freeSlot(a[k])
		s.freeSlot(a[k]) // a second call does nothing
	}
	for _, want := range []uint32{3, 64, 70, 100, n} {
		h := d.newHandle(driver.Exclusive, "a", s)
		if h.slot != want {
			t.Fatalf("slot %d, want %d", h.slot, want)
		}
		if want < n {
			a[want] = h
		} else {
			a = append(a, h)
		}
	}
	for _, h := range a {
		s.freeSlot(h)
	}
	if _, ok := s.grants[slotHash(driver.Exclusive, "a")]; ok {
		t.Fatal("a name with no slot in use is still recorded")
	}
	if h := d.newHandle(driver.Exclusive, "a", s); h.slot != 0 {
		t.Fatalf("after all were freed: slot %d, want 0", h.slot)
	} else {
		s.freeSlot(h)
	}
	s.freeSlot(b)
	s.freeSlot(w)
	if len(s.grants) != 0 {
		t.Fatalf("%d names recorded, want none", len(s.grants))
	}
}

// TestHandleSize: the driver keeps a handle per held grant; it fits the
// 80-byte size class.
func TestHandleSize(t *testing.T) {
	if s := unsafe.Sizeof(handle{}); s > 80 {
		t.Fatalf("a handle takes %d bytes, more than 80", s)
	}
}

// TestSlotsHashCollision: handles of another name that share a list (their
// hashes collide) neither take nor free this name's slots.
func TestSlotsHashCollision(t *testing.T) {
	d := &Driver{prefix: "p/"}
	s := &session{prefixLen: len(d.prefix)}
	z := d.newHandle(driver.Exclusive, "z", s)
	delete(s.grants, slotHash(driver.Exclusive, "z"))
	s.grants[slotHash(driver.Exclusive, "a")] = z // as if "z" hashed like "a"
	a := d.newHandle(driver.Exclusive, "a", s)
	if a.slot != 0 {
		t.Fatalf("slot %d, want 0 (z's slot is another name's)", a.slot)
	}
	a1 := d.newHandle(driver.Exclusive, "a", s)
	if a1.slot != 1 {
		t.Fatalf("slot %d, want 1", a1.slot)
	}
	s.freeSlot(a)
	s.freeSlot(a1)
	if g := s.grants[slotHash(driver.Exclusive, "a")]; g != z || z.next != nil {
		t.Fatalf("after freeing a's slots the list is %p (next %p), want z %p alone", g, z.next, z)
	}
}
