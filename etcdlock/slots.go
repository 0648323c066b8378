package etcdlock

// Queue key slots.
//
// etcd keeps an index entry for every key ever written until a compaction
// removes it, deleted keys included, and a range read walks those entries.
// A fresh key per acquire would make every read of a queue slower the more
// often its lock was taken (without auto-compaction, etcd 3.4's default).
// So the keys of one lease on one name are reused: a lock's key is
//
//	<prefix><name>/<lease ID in hex>-<slot number in hex>
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
	"hash/maphash"
	"math"
	"math/bits"
	"slices"

	"github.com/dlock/dlock/driver"
)

// The driver's record of a lease's keys is one map per session, grants, from
// the hash of a kind and lock name (slotHash) to the handles of that hash
// whose slots are in use, linked through handle.next: those being acquired,
// held (handle.held), or whose key is not yet known gone. A held lock costs
// its handle and one map entry of 16 bytes plus the map's slack (no string:
// a handle's name is part of its key), and the reaper (reap.go) walks the
// same lists. A list holds more than one handle only while several owners
// hold or wait for one name through one driver, a release had an unknown
// outcome, or two names' hashes collide (a list's handles are told apart by
// kind and name).

// slotSeed seeds slotHash.
var slotSeed = maphash.MakeSeed()

// slotHash is the grants key of the slots of kind k of name.
func slotHash(k driver.Kind, name string) uint64 {
	return maphash.String(slotSeed, name) ^ uint64(k)*0x9e3779b97f4a7c15
}

// takeSlot gives h, a new handle of kind h.kind for name, the lowest slot of
// that kind and name on s not in use and the key key makes of it, and
// records the slot in use (links h; the key is set before another call can
// see h). A slot below 64 is found with one word; past 64 (a name with that
// many keys on one lease at once) the slots in use are sorted.
func (s *session) takeSlot(name string, h *handle, key func(slot uint32) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grants == nil {
		s.grants = map[uint64]*handle{}
	}
	hash := slotHash(h.kind, name)
	first := s.grants[hash]
	var low uint64
	var high []uint32
	for g := first; g != nil; g = g.next {
		if g.kind != h.kind || g.name() != name {
			continue // another name with the same hash
		}
		if g.slot < 64 {
			low |= 1 << g.slot
		} else {
			high = append(high, g.slot)
		}
	}
	if low != math.MaxUint64 {
		h.slot = uint32(bits.TrailingZeros64(^low))
	} else {
		slices.Sort(high)
		h.slot = 64
		for _, n := range high {
			if n != h.slot {
				break
			}
			h.slot++
		}
	}
	h.key = key(h.slot)
	h.next = first
	s.grants[hash] = h
}

// freeSlot records that h's key is known to be gone: its slot is free again
// (h is unlinked). Later calls for h do nothing.
func (s *session) freeSlot(h *handle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freeSlotLocked(h)
}

func (s *session) freeSlotLocked(h *handle) {
	if h.freed {
		return
	}
	h.freed = true
	hash := slotHash(h.kind, h.name())
	var prev *handle
	for g := s.grants[hash]; g != nil; prev, g = g, g.next {
		if g != h {
			continue
		}
		switch {
		case prev != nil:
			prev.next = h.next
		case h.next != nil:
			s.grants[hash] = h.next
		default:
			delete(s.grants, hash)
		}
		h.next = nil
		return
	}
}

// settleLocked frees h's slot once h's key is known gone (h is no longer
// held), no plain delete of it is in flight and none had an unknown outcome.
// s.mu must be held.
func (s *session) settleLocked(h *handle) {
	if h.held || h.pending > 0 || h.stale {
		return
	}
	s.freeSlotLocked(h)
}
