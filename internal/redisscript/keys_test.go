package redisscript

import (
	"strings"
	"testing"
)

// hashTag is the part of a key Redis Cluster hashes: the text between the
// first '{' and the next '}', when non-empty.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

func TestKeysShareSlotAndRoundTrip(t *testing.T) {
	names := []string{"orders/42", "a{b}c", "{", "}", "{}", "~x", "~", "x~", "日本語", "a:fence", "a}:fence", "a b", "~" + "YXtifWM"}
	seen := map[string]string{}
	for _, n := range names {
		k := KeysFor(DefaultPrefix, n)
		tag := hashTag(k.Lock)
		if hashTag(k.Fence) != tag || hashTag(k.Channel) != tag {
			t.Errorf("%q: keys %q %q %q do not share the hash tag %q", n, k.Lock, k.Fence, k.Channel, tag)
		}
		if strings.ContainsAny(tag, "{}") || tag == "" {
			t.Errorf("%q: bad hash tag %q", n, tag)
		}
		for _, key := range []string{k.Lock, k.Fence, k.Channel} {
			if other, dup := seen[key]; dup {
				t.Errorf("names %q and %q share key %q", n, other, key)
			}
			seen[key] = n
		}
		got, fence, ok := NameFromKey(DefaultPrefix, k.Lock)
		if !ok || fence || got != n {
			t.Errorf("NameFromKey(%q) = %q, %v, %v; want %q", k.Lock, got, fence, ok, n)
		}
		got, fence, ok = NameFromKey(DefaultPrefix, k.Fence)
		if !ok || !fence || got != n {
			t.Errorf("NameFromKey(%q) = %q, %v, %v; want %q fence", k.Fence, got, fence, ok, n)
		}
		if _, _, ok := NameFromKey(DefaultPrefix, k.Channel); ok {
			t.Errorf("NameFromKey accepted channel %q", k.Channel)
		}
	}
	if _, _, ok := NameFromKey(DefaultPrefix, "other:{x}"); ok {
		t.Error("NameFromKey accepted a key of another prefix")
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, p := range []string{"dlock:", "app1:locks:", ""} {
		if err := CheckPrefix(p); err != nil {
			t.Errorf("CheckPrefix(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"a{", "}", "a*", "q?", "x[1]", "t\n"} {
		if err := CheckPrefix(p); err == nil {
			t.Errorf("CheckPrefix(%q) accepted", p)
		}
	}
}

func TestParseValue(t *testing.T) {
	for _, tc := range []struct {
		v     string
		count int
		fence uint64
		owner string
		ok    bool
	}{
		{"1\n7\n\n\nowner", 1, 7, "owner", true},
		{"3\n18446744073709551615\n1763800000000\n400\na b\n c", 3, 18446744073709551615, "a b\n c", true},
		{"x\n7\n\n\no", 0, 0, "", false},
		{"1\n7\n\no", 0, 0, "", false},
	} {
		c, f, o, ok := ParseValue(tc.v)
		if c != tc.count || f != tc.fence || o != tc.owner || ok != tc.ok {
			t.Errorf("ParseValue(%q) = %d, %d, %q, %v", tc.v, c, f, o, ok)
		}
	}
}

// TestPlainKeys: in the plain layout the lock is the key itself and its
// companions share its cluster slot; a counter key leads back to its lock
// key; a dlock-layout lock is the plain lock at its own key.
func TestPlainKeys(t *testing.T) {
	for _, key := range []string{"orders:42", "lock", "{user:1}:lock", "a{b}c", "dlock:{x}", "日本語"} {
		k, err := PlainKeysFor(key)
		if err != nil {
			t.Fatalf("PlainKeysFor(%q): %v", key, err)
		}
		if k.Lock != key {
			t.Errorf("PlainKeysFor(%q).Lock = %q", key, k.Lock)
		}
		for _, c := range []string{k.Fence, k.Channel, k.Queue, k.Waits} {
			if hashTag(c) != hashTag(key) {
				t.Errorf("%q: companion %q is not in the key's slot (tag %q, want %q)", key, c, hashTag(c), hashTag(key))
			}
		}
		if got, ok := PlainKeyFromFence(k.Fence); !ok || got != key {
			t.Errorf("PlainKeyFromFence(%q) = %q, %v; want %q", k.Fence, got, ok, key)
		}
	}
	if k, _ := PlainKeysFor(KeysFor(DefaultPrefix, "x").Lock); k != KeysFor(DefaultPrefix, "x") {
		t.Errorf("the plain lock at dlock:{x} has keys %+v, not the dlock layout's", k)
	}
	for _, key := range []string{"a}b", "a{}b", "{", "x{y"} {
		if _, err := PlainKeysFor(key); err == nil {
			t.Errorf("PlainKeysFor(%q): no error for braces that form no hash tag", key)
		}
	}
	for _, fence := range []string{"x", ":fence", "a:fence", "{}:fence"} {
		if got, ok := PlainKeyFromFence(fence); ok {
			t.Errorf("PlainKeyFromFence(%q) = %q, want none", fence, got)
		}
	}
}

// TestRefKeys checks the keys a Ref slices out of its one string against
// the layout spelled out (see the package doc and PlainKeysFor).
func TestRefKeys(t *testing.T) {
	for _, n := range []string{"orders/42", "a{b}c", "{", "~x", "日本語", "a:fence", "", "q"} {
		lock := DefaultPrefix + "{" + encodeName(n) + "}"
		want := Keys{Lock: lock, Fence: lock + ":fence", Channel: lock + ":rel", Queue: lock + ":q", Waits: lock + ":qd"}
		if got := KeysFor(DefaultPrefix, n); got != want {
			t.Errorf("KeysFor(%q) = %+v, want %+v", n, got, want)
		}
		if got := RefFor(DefaultPrefix, n).Lock(); got != lock {
			t.Errorf("RefFor(%q).Lock() = %q, want %q", n, got, lock)
		}
	}
	for _, key := range []string{"orders:42", "a{b}c", "{x}", "x", "k:fence"} {
		b := key
		if !hasHashTag(key) {
			b = "{" + key + "}"
		}
		want := Keys{Lock: key, Fence: b + ":fence", Channel: b + ":rel", Queue: b + ":q", Waits: b + ":qd"}
		r, err := PlainRefFor(key)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Keys(); got != want {
			t.Errorf("PlainRefFor(%q).Keys() = %+v, want %+v", key, got, want)
		}
		if got := r.Lock(); got != key {
			t.Errorf("PlainRefFor(%q).Lock() = %q", key, got)
		}
	}
	if _, err := PlainRefFor("a{b"); err == nil {
		t.Error("PlainRefFor accepted braces that form no hash tag")
	}
	if n := testing.AllocsPerRun(100, func() { _ = RefFor(DefaultPrefix, "orders/42") }); n != 1 {
		t.Errorf("RefFor: %v allocations, want 1", n)
	}
}

// A Ref, kept per held lease, holds one key's worth of string (B+":qd"),
// not every key: the fencing counter and the release channel are built when
// Keys is called.
func TestRefKeepsOneKey(t *testing.T) {
	for _, name := range []string{"orders/42", "a{b}c", "~x"} {
		r := RefFor(DefaultPrefix, name)
		k := r.Keys()
		if len(r.buf) != len(k.Waits) {
			t.Errorf("RefFor(%q) keeps %d bytes, want %d (%q)", name, len(r.buf), len(k.Waits), k.Waits)
		}
		if n := testing.AllocsPerRun(100, func() { _ = r.Lock() }); n != 0 {
			t.Errorf("Ref.Lock: %v allocations, want 0", n)
		}
		if n := testing.AllocsPerRun(100, func() { _ = r.Keys() }); n > 1 {
			t.Errorf("Ref.Keys: %v allocations, want at most 1", n)
		}
	}
}
