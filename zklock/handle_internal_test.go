package zklock

import (
	"testing"
	"unsafe"
)

// The driver keeps a handle per held grant: a mutex's fits 48 bytes, what
// only a kind's grant needs being apart (kindGrant).
func TestHandleSize(t *testing.T) {
	if s := unsafe.Sizeof(handle{}); s > 48 {
		t.Fatalf("a handle takes %d bytes, more than 48", s)
	}
}
