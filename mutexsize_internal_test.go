package dlock

import (
	"testing"
	"unsafe"
)

// A Mutex made without options points at its Client's settings rather than
// holding a copy of them: it fits 64 bytes, not 128, the heap a NewMutex
// per Lock costs (see TestMutexSettings).
func TestMutexSize(t *testing.T) {
	if s := unsafe.Sizeof(Mutex{}); s > 64 {
		t.Fatalf("a Mutex takes %d bytes, more than 64", s)
	}
}
