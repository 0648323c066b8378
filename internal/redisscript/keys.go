// Package redisscript holds what the redislock and redlock drivers share: the
// key layout, the Lua scripts that change a lock's state atomically on one
// Redis server, batched renewal, inspection, and a pub/sub hub that
// multiplexes release channels over one connection.
//
// No driver imports another driver; both import this package instead.
//
// # Key layout
//
// For a lock named N under the key prefix P (default "dlock:"):
//
//	P{E}        string: count, token, lease expiry, lock-delay, owner (see scripts.go)
//	P{E}:fence  string: the fencing counter; survives release, never deleted
//	P{E}:rel    pub/sub channel: a message is published on every release
//	P{E}:q      zset: the waiter queue, owner → arrival (server ms)
//	P{E}:qd     hash: each queued owner's entry deadline (server ms)
//
// E is N itself when N contains no '{' or '}' and does not start with '~';
// otherwise E is '~' followed by the unpadded URL-safe base64 of N. Either
// way E contains no braces, so the hash tag of every key is exactly E: a
// lock's keys share one Redis Cluster slot, and two different names never
// map to the same keys (a plain E never starts with '~').
//
// A key at P{E} or P{E}:fence that dlock did not write (another type, or a
// string that is not a dlock value or counter) is a lock held by an unknown
// owner: the scripts never overwrite it and never fail on it (see
// AcquireResult.Foreign and NodeLock.Foreign).
package redisscript

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the key prefix used when none is configured.
const DefaultPrefix = "dlock:"

// Keys are the Redis keys and channel of one lock.
type Keys struct {
	Lock    string // the lock
	Fence   string // the fencing counter
	Channel string // the release channel
	Queue   string // the waiter queue: a zset of owners by arrival
	Waits   string // the waiter queue's deadlines: a hash owner → server ms
}

// KeysFor returns the keys of the lock name under prefix, in two
// allocations (see Ref).
func KeysFor(prefix, name string) Keys {
	return RefFor(prefix, name).Keys()
}

// Ref is a compact form of one lock's Keys, for what a driver keeps per
// held lease (a grant's handle, its entry in the book of Grants): the one
// string B+":qd", where B is the lock's hash-tagged base, P{E} in the dlock
// layout, B or "{"+B+"}" in the plain layout (see PlainKeysFor). The lock,
// queue and queue-deadline keys are slices of it; Keys builds the fencing
// counter and release channel in one more allocation, when a call needs
// them (an acquire or a release, not a renewal), rather than keeping them
// for as long as the lease is held (they were two thirds of a Ref).
type Ref struct {
	buf   string
	inner bool // the lock is B without its outer braces (plain layout, no hash tag)
}

// refFor builds the Ref of the base made of parts, in one allocation.
func refFor(inner bool, parts ...string) Ref {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var sb strings.Builder
	sb.Grow(n + len(":qd"))
	for _, p := range parts {
		sb.WriteString(p)
	}
	sb.WriteString(":qd")
	return Ref{buf: sb.String(), inner: inner}
}

// RefFor is the Ref of KeysFor(prefix, name).
func RefFor(prefix, name string) Ref {
	return refFor(false, prefix, "{", encodeName(name), "}")
}

// Keys returns the keys r refers to: Lock, Queue and Waits share r's
// string, Fence and Channel one new allocation.
func (r Ref) Keys() Keys {
	n := len(r.buf) - len(":qd")
	base := r.buf[:n]
	fc := base + ":fence" + base + ":rel"
	f := n + len(":fence")
	return Keys{Lock: r.Lock(), Queue: r.buf[:n+2], Waits: r.buf, Fence: fc[:f], Channel: fc[f:]}
}

// Lock is r.Keys().Lock, without allocating.
func (r Ref) Lock() string {
	n := len(r.buf) - len(":qd")
	if r.inner {
		return r.buf[1 : n-1]
	}
	return r.buf[:n]
}

// PlainKeysFor returns the keys of a lock in the plain layout, where the
// lock is the Redis key itself, as clients that lock with SET key value NX
// PX keep it (redis-py's Lock, redsync, bsm/redislock): Lock is key, and
// the fencing counter, release channel and waiter queue are beside it in
// key's hash slot, B+":fence", B+":rel", B+":q" and B+":qd", where B is key
// when key has a hash tag and "{"+key+"}" otherwise. (A dlock-layout lock
// is thus the plain lock at its key P{E}.) A key with '{' or '}' that form
// no hash tag is refused: its slot could hold no other key.
func PlainKeysFor(key string) (Keys, error) {
	r, err := PlainRefFor(key)
	if err != nil {
		return Keys{}, err
	}
	return r.Keys(), nil
}

// PlainRefFor is the Ref of PlainKeysFor(key).
func PlainRefFor(key string) (Ref, error) {
	if hasHashTag(key) {
		return refFor(false, key), nil
	}
	if strings.ContainsAny(key, "{}") {
		return Ref{}, fmt.Errorf("key %q has braces that form no hash tag: the plain layout cannot keep its fencing counter in the key's cluster slot", key)
	}
	return refFor(true, "{", key, "}"), nil
}

// hasHashTag reports whether key has a Redis Cluster hash tag: a '{'
// followed, later, by a '}' with at least one byte between them.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	return i >= 0 && strings.IndexByte(key[i+1:], '}') > 0
}

// PlainKeyFromFence returns the lock key of a plain-layout fencing counter
// key (see PlainKeysFor), and whether fence is one. "{K}:fence" is read as
// the counter of K (K without braces), not of the key "{K}".
func PlainKeyFromFence(fence string) (string, bool) {
	b, ok := strings.CutSuffix(fence, ":fence")
	if !ok || b == "" {
		return "", false
	}
	if inner, ok := strings.CutPrefix(b, "{"); ok && strings.HasSuffix(inner, "}") && !strings.ContainsAny(inner[:len(inner)-1], "{}") && len(inner) > 1 {
		return inner[:len(inner)-1], true
	}
	if hasHashTag(b) {
		return b, true
	}
	return "", false
}

// queue and waits return k.Queue and k.Waits, derived from k.Lock when
// they are empty (Keys built by hand).
func (k Keys) queue() string {
	if k.Queue != "" {
		return k.Queue
	}
	return k.Lock + ":q"
}

func (k Keys) waits() string {
	if k.Waits != "" {
		return k.Waits
	}
	return k.Lock + ":qd"
}

// releaseKeys are the KEYS of the release and leave scripts.
func (k Keys) releaseKeys() []string { return []string{k.Lock, k.queue(), k.waits()} }

func encodeName(name string) string {
	if strings.ContainsAny(name, "{}") || strings.HasPrefix(name, "~") {
		return "~" + base64.RawURLEncoding.EncodeToString([]byte(name))
	}
	return name
}

// NameFromKey returns the lock name of a lock or fence key under
// prefix, and whether key is one. Channels and foreign keys return false.
func NameFromKey(prefix, key string) (name string, fence, ok bool) {
	rest, found := strings.CutPrefix(key, prefix)
	if !found || !strings.HasPrefix(rest, "{") {
		return "", false, false
	}
	end := strings.IndexByte(rest, '}')
	if end < 0 {
		return "", false, false
	}
	enc, tail := rest[1:end], rest[end+1:]
	switch tail {
	case "":
	case ":fence":
		fence = true
	default:
		return "", false, false
	}
	if enc == "" {
		return "", false, false
	}
	if strings.HasPrefix(enc, "~") {
		raw, err := base64.RawURLEncoding.DecodeString(enc[1:])
		if err != nil {
			return "", false, false
		}
		return string(raw), fence, true
	}
	return enc, fence, true
}

// CheckPrefix reports whether p can be used as a key prefix. A prefix must
// not contain '{' or '}' (it would move every lock into one hash slot, or
// break the slot of each) and must not contain glob characters, which
// would make SCAN patterns ambiguous.
func CheckPrefix(p string) error {
	if strings.ContainsAny(p, "{}") {
		return errors.New("key prefix must not contain '{' or '}'")
	}
	if strings.ContainsAny(p, "*?[]\\") {
		return fmt.Errorf("key prefix %q must not contain glob characters *?[]\\", p)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("key prefix %q must not contain control characters", p)
		}
	}
	return nil
}
