package etcdlock

// Queue key slots.
//
// etcd keeps an index entry for every key ever written until a compaction
// removes it, deleted keys included, and a range read walks those entries.
// A fresh key per acquire would make every read of a queue slower the more
// often its lock was taken (without auto-compaction, etcd 3.4's default).
// So the keys of one lease on one name are reused: a lock's key is
//
//	<prefix><name>/<lease ID in hex>-<slot number, 16 hex digits>
//
// where the slot is the lowest one of that lease on that name that is not in
// use. Usually a lease holds or waits for a lock once at a time, and every
// grant of the lock on that lease is the key of slot 0: the range reads see
// one index entry per lease, however often the lock was taken.
//
// A slot is in use from the acquire that takes it until the driver knows its
// key is gone: a release, a discard after a failed acquire or a reap that
// the server confirmed, or a Renew that found the key gone. A release whose
// outcome is unknown keeps the slot: a later acquire of the same owner on
// the same lease takes another slot, so it queues behind the grant whose
// release is pending rather than adopting its key. When every slot of a name
// is free again, the name is forgotten.
//
// Release deletes the key with a plain delete, not a transaction guarded by
// the grant's create revision: on etcd 3.4 a transaction that writes costs
// about 60µs more than a plain delete (it first reads on a copy of the
// backend's write buffer). That is safe because a plain delete of a key can
// only delete the grant it was sent for: the key is this lease's alone, and
// its slot is not taken again while any plain delete of it may still reach
// the server. A slot is freed only when the key is known gone, no Release of
// the grant is in flight (pending), and no plain delete ever ended with an
// unknown outcome (stale): such a slot stays in use until the lease ends, and
// later grants take other slots. A Release of a grant whose key is known
// gone returns ErrNotHeld without a request. Every other delete (a discard,
// a reap, a release that also deletes a lock-delay guard) is guarded by the
// create revision.

import (
	"math"
	"math/bits"
)

// slots is the slot record of one name on one lease: a bit per slot below
// 64, set while the slot is in use, and the record of the higher slots,
// which only a name taken more than 64 times at once on one lease (the same
// owner re-queueing behind releases with unknown outcomes, or many owners
// through one driver) ever uses. The driver keeps one per held name, so the
// common case is one word.
type slots struct {
	low  uint64
	high *highSlots // slots from 64 up; nil while none is in use
}

// highSlots records the slots from 64 up of one name on one lease.
type highSlots struct {
	used int      // slots in use
	free []uint64 // free slots below next
	next uint64   // slots from next up were never used
}

// takeSlot returns the lowest free slot of name on s, and marks it in use.
func (s *session) takeSlot(name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slots == nil {
		s.slots = map[string]slots{}
	}
	sl := s.slots[name]
	if sl.low != math.MaxUint64 {
		n := uint64(bits.TrailingZeros64(^sl.low))
		sl.low |= 1 << n
		s.slots[name] = sl
		return n
	}
	if sl.high == nil {
		sl.high = &highSlots{next: 64}
		s.slots[name] = sl
	}
	h := sl.high
	h.used++
	if len(h.free) == 0 {
		h.next++
		return h.next - 1
	}
	low := 0
	for i, n := range h.free {
		if n < h.free[low] {
			low = i
		}
	}
	n := h.free[low]
	h.free[low] = h.free[len(h.free)-1]
	h.free = h.free[:len(h.free)-1]
	return n
}

// freeSlot records that slot n of name on s is known to have no key any
// more. It must be called once for each takeSlot, and only then.
func (s *session) freeSlot(name string, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freeSlotLocked(name, n)
}

func (s *session) freeSlotLocked(name string, n uint64) {
	sl, ok := s.slots[name]
	if !ok {
		return
	}
	if n < 64 {
		sl.low &^= 1 << n
	} else if h := sl.high; h != nil {
		h.used--
		if h.used <= 0 {
			sl.high = nil
		} else {
			h.free = append(h.free, n)
		}
	}
	if sl.low == 0 && sl.high == nil {
		delete(s.slots, name)
		return
	}
	s.slots[name] = sl
}

// settleLocked frees h's slot once h's key is known gone (h is no longer
// held), no plain delete of it is in flight and none had an unknown outcome.
// s.mu must be held.
func (s *session) settleLocked(h *handle) {
	if _, held := s.held[h]; held || h.pending > 0 || h.stale || h.freed {
		return
	}
	h.freed = true
	s.freeSlotLocked(h.slotName(), h.slot)
}
