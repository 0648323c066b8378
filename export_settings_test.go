package dlock

import (
	"time"
	"unsafe"
)

// MutexSettings returns the TTL and owner m's locks are taken with, and
// where m keeps them (two Mutexes that share their settings give the same).
func MutexSettings(m *Mutex) (ttl time.Duration, owner string, at unsafe.Pointer) {
	return m.r.ttl, m.r.owner, unsafe.Pointer(m.r)
}
