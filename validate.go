package dlock

import (
	"crypto/rand"
	"encoding/base64"
	"unicode"
	"unicode/utf8"

	"github.com/dlock/dlock/driver"
)

// checkName applies the rules every backend shares; a driver may add its own
// through driver.NameChecker.
func checkName(name string, d driver.Driver) error {
	switch {
	case name == "":
		return invalid("name", "must not be empty")
	case len(name) > maxNameBytes:
		return invalid("name", "must be at most %d bytes, got %d", maxNameBytes, len(name))
	case !utf8.ValidString(name):
		return invalid("name", "must be valid UTF-8")
	}
	for i, r := range name {
		if unicode.IsControl(r) {
			return invalid("name", "must not contain control characters (found %U at byte %d)", r, i)
		}
	}
	if nc, ok := d.(driver.NameChecker); ok {
		if err := nc.CheckName(name); err != nil {
			return invalid("name", "%v", err)
		}
	}
	return nil
}

func checkOwner(owner string) error {
	if len(owner) > maxOwnerLen {
		return invalid("Owner", "must be at most %d characters, got %d", maxOwnerLen, len(owner))
	}
	for i := 0; i < len(owner); i++ {
		if c := owner[i]; c < 0x21 || c > 0x7e {
			return invalid("Owner", "must be printable ASCII without spaces (byte %d is %#x)", i, c)
		}
	}
	return nil
}

// newOwner returns a random 128-bit owner token in unpadded URL-safe
// base64: 22 characters, which fit the allocator's 24-byte size class (32
// hex digits took the 32-byte one), for a string every held lease keeps
// and most drivers share.
func newOwner() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand never fails on supported platforms (Go 1.24+ crashes
		// the program itself if it does); keep the guard for older ones.
		panic("dlock: crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}
