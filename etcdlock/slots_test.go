package etcdlock

import "testing"

// TestSlots: a name's slots are the lowest free ones, past 64 too, and the
// name is forgotten once every slot is free again.
func TestSlots(t *testing.T) {
	s := &session{}
	const n = 150
	for i := range uint64(n) {
		if got := s.takeSlot("a"); got != i {
			t.Fatalf("take %d: slot %d", i, got)
		}
	}
	if got := s.takeSlot("b"); got != 0 {
		t.Fatalf("another name: slot %d, want 0", got)
	}
	for _, k := range []uint64{100, 3, 70, 64} {
		s.freeSlot("a", k)
	}
	for _, want := range []uint64{3, 64, 70, 100, n} {
		if got := s.takeSlot("a"); got != want {
			t.Fatalf("slot %d, want %d", got, want)
		}
	}
	for i := range uint64(n + 1) {
		s.freeSlot("a", i)
	}
	if _, ok := s.slots["a"]; ok {
		t.Fatal("a name with no slot in use is still recorded")
	}
	if got := s.takeSlot("a"); got != 0 {
		t.Fatalf("after all were freed: slot %d, want 0", got)
	}
	s.freeSlot("b", 0)
	s.freeSlot("a", 0)
	if len(s.slots) != 0 {
		t.Fatalf("%d names recorded, want none", len(s.slots))
	}
}
