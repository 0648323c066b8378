package redisscript

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
)

// KindKeys are the Redis keys of the read/write lock or the semaphore of a
// name. They share the name's hash tag with its mutex (Keys), so all of a
// name's keys are in one Redis Cluster slot, but they are different keys:
// a name's mutex, read/write lock and semaphore never exclude one another.
//
// For a name whose mutex key is P{E}:
//
//	P{E}:rw        string: the writer, in the mutex's value format
//	P{E}:rw:r      zset: reader owner → its place's end (lease expiry plus lock-delay, server ms)
//	P{E}:rw:rh     hash: reader owner → count \n token \n expiry \n lock-delay
//	P{E}:rw:ww     zset: waiting writer owner → the mark's end (server ms)
//	P{E}:rw:fence  string: the fencing counter of reads and writes together
//	P{E}:sem       zset: permit holder owner → its place's end
//	P{E}:sem:h     hash: permit holder owner → count \n token \n expiry \n lock-delay,
//	               and the semaphore's permit count at the empty field "" (no owner is empty)
//	P{E}:sem:fence string: the fencing counter of permits
//
// Every kind publishes its releases on the name's one release channel,
// P{E}:rel (see Keys.Channel).
type KindKeys struct {
	Kind    driver.Kind
	Writer  string // Write: the writer key; Read: the writer key too
	Holders string // Read: readers zset; Permit: holders zset
	Values  string // Read: readers hash; Permit: holders hash
	Marks   string // waiting writers (read/write lock only)
	Fence   string // the kind's fencing counter
	Channel string // the name's release channel
}

// KindKeysFor returns the keys of the lock of kind k of name under prefix.
// Exclusive returns the mutex's lock and fence keys (Writer and Fence).
func KindKeysFor(prefix, name string, k driver.Kind) KindKeys {
	base := KeysFor(prefix, name).Lock
	kk := KindKeys{Kind: k, Channel: base + ":rel"}
	switch k {
	case driver.Read, driver.Write:
		kk.Writer, kk.Holders, kk.Values = base+":rw", base+":rw:r", base+":rw:rh"
		kk.Marks, kk.Fence = base+":rw:ww", base+":rw:fence"
	case driver.Permit:
		kk.Holders, kk.Values, kk.Fence = base+":sem", base+":sem:h", base+":sem:fence"
	default:
		kk.Writer, kk.Fence = base, base+":fence"
	}
	return kk
}

// ID is the key a driver books a grant of this kind under (see
// Grants.GrantedKind): the writer key for Write, the holders hash for Read
// and Permit, never a mutex's lock key.
func (kk KindKeys) ID() string {
	if kk.Kind == driver.Read || kk.Kind == driver.Permit {
		return kk.Values
	}
	return kk.Writer
}

// kindTails maps the tail of every key of a kind (after P{E}) to its kind.
var kindTails = map[string]driver.Kind{
	":rw": driver.Write, ":rw:r": driver.Write, ":rw:rh": driver.Write, ":rw:ww": driver.Write, ":rw:fence": driver.Write,
	":sem": driver.Permit, ":sem:h": driver.Permit, ":sem:fence": driver.Permit,
}

// KindFromKey returns the name and kind of a key of a read/write lock
// (Write) or a semaphore (Permit) under prefix, and whether key is one.
func KindFromKey(prefix, key string) (name string, k driver.Kind, ok bool) {
	rest, found := strings.CutPrefix(key, prefix)
	if !found || !strings.HasPrefix(rest, "{") {
		return "", 0, false
	}
	end := strings.IndexByte(rest, '}')
	if end < 0 {
		return "", 0, false
	}
	k, ok = kindTails[rest[end+1:]]
	if !ok {
		return "", 0, false
	}
	name, _, ok = NameFromKey(prefix, prefix+rest[:end+1])
	return name, k, ok
}

// raiseSrc raises a fencing counter to at least a value.
//
//	KEYS[1] counter, ARGV[1] value
//
// Returns 1, or 0 without writing when a key dlock did not write is at the
// counter.
var raiseSrc = `
local v = redis.pcall('GET', KEYS[1])
if v and (type(v) ~= 'string' or not string.match(v, '^%d+$')) then return 0 end
if not v or tonumber(v) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
`

var raiseScript = redis.NewScript(raiseSrc)

// FenceKey returns the fencing counter of the lock of kind k of name.
func FenceKey(prefix, name string, k driver.Kind) string {
	return KindKeysFor(prefix, name, k).Fence
}

// RaiseFence sets the fencing counter at key to atLeast if it is lower (the
// next grant then gets a larger token) and leaves it alone otherwise. It
// fails with ErrForeignFence, writing nothing, when a key dlock did not
// write is at the counter.
func RaiseFence(ctx context.Context, c redis.Scripter, key string, atLeast uint64) error {
	n, err := raiseScript.Run(ctx, c, []string{key}, strconv.FormatUint(atLeast, 10)).Int64()
	if err != nil {
		return err
	}
	if n != 1 {
		return ErrForeignFence
	}
	return nil
}

// CheckKind refuses a kind the Redis drivers do not know.
func CheckKind(k driver.Kind) error {
	switch k {
	case driver.Exclusive, driver.Read, driver.Write, driver.Permit:
		return nil
	}
	return fmt.Errorf("lock kind %v: %w", k, driver.ErrUnsupported)
}
