// Package redislock is the dlock driver for one Redis server (or a Redis
// Cluster, or a Sentinel-managed primary) over go-redis v9.
//
// Import it for its side effect to make the redis://, rediss:// and
// redis-sentinel:// URL schemes available to dlock.Open:
//
//	import _ "github.com/dlock/dlock/redislock"
//
//	client, err := dlock.Open(ctx, "redis://:secret@localhost:6379/0")
//	client, err := dlock.Open(ctx, "redis-sentinel://s1:26379,s2:26379,s3:26379/0?master_name=locks&password=secret&min_replicas=1")
//
// or construct a driver over a go-redis client you already have with New.
//
// # How a lock is kept
//
// Every state change is one Lua script run with EVALSHA (falling back to
// EVAL after a flushed script cache), so it is atomic on the server. A lock
// named N is a string at "dlock:{N}" holding the owner, the hold count, the
// fencing token and, with a lock-delay, the lease's expiry by the server's
// clock; the key's own PX expiry is the TTL plus the lock-delay. The fencing counter lives in a
// companion key "dlock:{N}:fence" in the same hash slot, is incremented by
// the acquire script for every new grant and is never deleted, so tokens keep
// rising across releases, expiries and crashed holders. Names containing
// '{' or '}' (or starting with '~') are stored base64-encoded, so a user's
// braces can never change a key's hash slot, and two names never share keys.
//
// A release deletes the key and publishes on "dlock:{N}:rel". Waiters of
// one driver share a single pub/sub connection; see Driver.Subscribe for who
// is woken.
//
// A waiting Lock (Driver.Acquire) queues in Redis: "dlock:{N}:q" is a sorted
// set of the waiting owners by arrival (server ms), "dlock:{N}:qd" a hash of
// each entry's deadline. A free lock goes to the first live waiter only; a
// release grants the lock to that waiter when it asked (a waiting Lock does,
// from its second attempt on, except in the plain layout and with
// MinReplicas) and its driver is connected, and publishes the grant on the
// driver's own channel, so that the hand-off is one message; otherwise it
// publishes that waiter's owner, so only it is woken. TryLock or a
// releaser asking again go behind the queue. A waiter renews its entry
// every second; an entry whose waiter vanished is dropped three seconds
// after its last renewal. Both keys expire with their last entry.
//
// A key that dlock did not write, of any type, at "dlock:{N}" (another
// client's SET NX PX lock, a Redisson hash, anything) is a lock held by an
// unknown owner; so is one at "dlock:{N}:fence" while the lock is free. The
// scripts never overwrite such a key: an acquire is refused (RetryAfter is
// the key's PTTL, unknown when it has none), a waiting Lock waits until it
// expires or is deleted, Release and Renew report ErrNotHeld, and Inspect
// shows the name held by "?".
//
// Close releases whatever the driver granted and nobody released, grants
// that were completing while Close began included, before it closes its
// connections.
//
// # Sharing locks with other Redis clients: layout=plain
//
// With Options.Layout LayoutPlain (URL parameter layout=plain) a mutex
// lives at the key named N itself (key_prefix, empty by default, before
// it), in the same value format, so that clients that lock a key with SET
// key value NX PX and release it with a compare-and-delete (redis-py's
// Lock, redsync, bsm/redislock, most hand-written locks) and dlock exclude
// one another. dlock keeps its fencing counter, release channel and queue
// beside the key in its hash slot ("{N}:fence", "{N}:rel", …, or "N:fence",
// … when N has a hash tag), never overwrites the foreign client's key,
// waits for it by its PTTL and by polling its deletion every 20-250ms (a
// foreign release publishes nothing), and keeps tokens and lock-delay for
// its own grants; see LayoutPlain for what a foreign client cannot give.
// Read/write locks and semaphores are refused in that layout.
//
// # Guarantees and their limits
//
// Mutual exclusion holds as far as the Redis server's memory does: on one
// server without failover it holds among live holders. With replication
// (Sentinel, Cluster) a grant acknowledged by a primary can be lost when the
// primary fails before the replica has it, because Redis replicates
// asynchronously; a second holder is then possible. Fencing tokens are
// stored the same way and share that limit.
//
// Options.MinReplicas (min_replicas=N) narrows that: every grant is followed,
// on the same connection, by WAIT N, and a grant fewer replicas
// acknowledged within Options.ReplicaTimeout is released and fails with
// ErrNotReplicated, so the caller never holds a lock (or a token) that
// only the master has; renewals not acknowledged are not confirmed. A
// failover to a replica that acknowledged keeps every lock and fencing
// counter. WAIT is not consensus: a failover to a replica that did not
// acknowledge (Sentinel promotes the most up-to-date replica it can reach,
// which need not be one that did) still loses grants. Use the redlock
// driver, or a consensus backend (etcd, ZooKeeper), if failover must never
// break exclusion.
package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/redislane"
	"github.com/dlock/dlock/internal/redisscript"
)

// DefaultKeyPrefix is the prefix of every key and channel when
// Options.KeyPrefix is empty.
const DefaultKeyPrefix = redisscript.DefaultPrefix

// Options configure a Driver. The zero value (or nil) gives the defaults.
// Each field maps to the URL query parameter named in its comment.
type Options struct {
	// KeyPrefix is prepended to every key and channel the driver uses
	// (URL parameter key_prefix). It must not contain '{', '}', glob
	// characters (*?[]\) or control characters. Default "dlock:".
	KeyPrefix string
	// Layout is where a mutex lives (URL parameter layout): LayoutDlock
	// (the default) keeps it at KeyPrefix{name}, with its companions beside
	// it; LayoutPlain keeps it at the key KeyPrefix+name itself, where
	// clients that lock with SET key value NX PX and a compare-and-delete
	// release (redis-py's Lock, redsync, bsm/redislock) keep theirs, so that
	// dlock and they exclude one another. In LayoutPlain KeyPrefix defaults
	// to "" and may be empty; see LayoutPlain for what changes.
	Layout string
	// MinReplicas, when above 0, makes every grant wait with WAIT until
	// that many replicas acknowledged it (URL parameter min_replicas): the
	// grant script and its WAIT run on one connection, so the lock's value
	// and its fencing counter (written by the same script) are both
	// covered. A grant not acknowledged within ReplicaTimeout is released
	// and returned as an error wrapping ErrNotReplicated, never handed to
	// the caller; a renewal not acknowledged counts as not confirmed; a
	// fence raise not acknowledged fails. Releases, waiting-queue entries
	// and waiting-writer marks do not wait. It needs one master: client must
	// be a *redis.Client (redis.NewClient, or redis.NewFailoverClient for
	// Sentinel); with another client New refuses it (driver.ErrInvalid).
	// WAIT is not consensus: a failover to a replica that did not
	// acknowledge can still lose a grant. Default 0: no waiting (Redis
	// replicates asynchronously).
	MinReplicas int
	// ReplicaTimeout bounds each WAIT of MinReplicas (URL parameter
	// replica_timeout); at least 1ms. Keep it well below the lease TTL. It
	// is added to the latency of a grant whose replicas lag. Default
	// DefaultReplicaTimeout (1s).
	ReplicaTimeout time.Duration
}

// Layouts (Options.Layout).
const (
	// LayoutDlock keeps a mutex at KeyPrefix{name}: every key of a lock
	// carries the name as its hash tag (see redisscript.KeysFor).
	LayoutDlock = "dlock"
	// LayoutPlain keeps a mutex at the key KeyPrefix+name itself, in the
	// same value format, with its fencing counter, release channel and
	// waiter queue beside it in its hash slot (B:fence, B:rel, B:q, B:qd,
	// where B is the key when it has a hash tag and {key} otherwise; see
	// redisscript.PlainKeysFor). A foreign client's value at the key (any
	// value dlock did not write) is a lock held by an unknown owner: never
	// overwritten, waited for by its PTTL and its deletion (polled every
	// 20-250ms, since foreign releases publish nothing). Foreign clients
	// see dlock's value as held (SET NX fails), dlock's lock-delay
	// included, and cannot delete it (their release compares their own
	// token). What they cannot give: a foreign grant takes no token from
	// dlock's counter (dlock's tokens still increase across it, but a
	// foreign holder has none to fence with), has no lock-delay, wakes
	// nobody on release, and ignores dlock's queue (it may take a free lock
	// before dlock's first waiter). A key with braces that form no hash tag
	// is refused as a name. Read/write locks and semaphores are not served
	// (driver.ErrUnsupported): foreign clients have none to share.
	LayoutPlain = "plain"
)

// Driver is a dlock driver over one go-redis client. It implements
// driver.Driver, driver.Notifier, driver.Inspector and driver.Limiter, and is
// safe for concurrent use.
type Driver struct {
	client redis.UniversalClient
	own    bool // Close closes client (opened from a URL)
	prefix string
	plain  bool // Options.Layout is LayoutPlain
	hub    *redisscript.Hub

	// With Options.MinReplicas: the client as a *redis.Client, the
	// replicas every grant waits for, and for how long.
	single         *redis.Client
	minReplicas    int
	replicaTimeout time.Duration

	lane *redislane.Lane // the mutex grants' and releases' own connection (a *redis.Client only)

	// Grant-in-release (grant.go): grantCh is the channel the server
	// publishes this driver's waiters' grants on ("": the driver does not
	// ask for grants), subscribed once (grantSubbed, under grantMu) with
	// grantSig as its subscription's (unused) wake-up; waiters are the
	// waiting Acquires that ask for grants.
	grantCh     string
	grantMu     sync.Mutex
	grantSubbed bool
	grantTried  time.Time
	grantSig    chan struct{}
	waiters     grantWaiters
	grantsTaken atomic.Int64 // grants taken from a message (for tests)

	gate      redisscript.Gate   // Close waits for calls in flight, refuses new ones
	grants    redisscript.Grants // granted and not released: Close releases them
	stop      chan struct{}      // closed when Close (or kill) begins: wakes waiters
	stopOnce  sync.Once
	closeOnce sync.Once
	closeErr  error
}

var (
	_ driver.Driver      = (*Driver)(nil)
	_ driver.Notifier    = (*Driver)(nil)
	_ driver.Inspector   = (*Driver)(nil)
	_ driver.Limiter     = (*Driver)(nil)
	_ driver.Queuer      = (*Driver)(nil)
	_ driver.FenceRaiser = (*Driver)(nil)
)

// New returns a driver that keeps locks through client. Close does not close
// client.
//
// Give client ContextTimeoutEnabled: true so that context deadlines bound
// every network wait; without it go-redis bounds reads by its ReadTimeout
// only. With a *redis.ClusterClient a lock's keys share one slot by their
// hash tag, and renewal sends one script call per lease in one pipeline per
// node. A Sentinel failover client (redis.NewFailoverClient) follows the
// master across failovers: renewals, waiters' pub/sub and Inspect reach the
// promoted replica once Sentinel names it. A nil client or a bad Options
// field (MinReplicas with a client other than a *redis.Client included) is
// refused with an error wrapping driver.ErrInvalid.
func New(client redis.UniversalClient, o *Options) (*Driver, error) {
	if client == nil {
		return nil, openurl.Invalid("client", "redislock: client is nil")
	}
	prefix := DefaultKeyPrefix
	plain := false
	if o != nil {
		switch o.Layout {
		case "", LayoutDlock:
		case LayoutPlain:
			plain, prefix = true, ""
		default:
			return nil, openurl.Invalid("Layout", "redislock: layout %q is not %q or %q", o.Layout, LayoutDlock, LayoutPlain)
		}
		if o.KeyPrefix != "" {
			prefix = o.KeyPrefix
		}
	}
	if err := redisscript.CheckPrefix(prefix); err != nil {
		return nil, openurl.Invalid("KeyPrefix", "redislock: invalid KeyPrefix: %w", err)
	}
	single, minReplicas, replicaTimeout, err := replicaOptions(client, o)
	if err != nil {
		return nil, err
	}
	d := &Driver{client: client, prefix: prefix, plain: plain, stop: make(chan struct{}),
		single: single, minReplicas: minReplicas, replicaTimeout: replicaTimeout}
	var filter func(channel, payload string) bool
	if !plain && minReplicas == 0 {
		d.grantCh, d.grantSig = redisscript.NewGrantChannel(prefix), make(chan struct{}, 1)
		filter = d.hubFilter
	}
	d.hub = redisscript.NewHub(client, filter)
	d.hub.SetLinger(listenLinger)
	if c, ok := client.(*redis.Client); ok && minReplicas == 0 {
		d.lane = redislane.New(c)
	}
	return d, nil
}

func (d *Driver) keys(name string, handle any) redisscript.Keys {
	switch h := handle.(type) {
	case *redisscript.Ref:
		if h != nil {
			return h.Keys()
		}
	case *redisscript.Keys:
		if h != nil {
			return *h
		}
	}
	k, err := d.mutexKeys(name)
	if err != nil {
		// A name the layout refuses was never granted: these keys hold
		// nothing of it.
		return redisscript.KeysFor(d.prefix, name)
	}
	return k
}

// lockKey is d.keys(name, handle).Lock, without building the other keys
// of a grant's handle (a renewal needs only the lock's).
func (d *Driver) lockKey(name string, handle any) string {
	if h, ok := handle.(*redisscript.Ref); ok && h != nil {
		return h.Lock()
	}
	return d.keys(name, handle).Lock
}

// mutexKeys are the keys of name's mutex in the driver's layout. A name
// the plain layout refuses (see CheckName) is an error wrapping
// driver.ErrInvalid.
func (d *Driver) mutexKeys(name string) (redisscript.Keys, error) {
	if !d.plain {
		return redisscript.KeysFor(d.prefix, name), nil
	}
	k, err := redisscript.PlainKeysFor(d.prefix + name)
	if err != nil {
		return k, openurl.Invalid("name", "redislock: layout=plain: %w", err)
	}
	return k, nil
}

var _ driver.NameChecker = (*Driver)(nil)

// mutexRef is mutexKeys in the compact form a grant keeps (its handle and
// its entry in the book): one allocation for every key.
func (d *Driver) mutexRef(name string) (*redisscript.Ref, error) {
	var r redisscript.Ref
	if !d.plain {
		r = redisscript.RefFor(d.prefix, name)
	} else {
		var err error
		if r, err = redisscript.PlainRefFor(d.prefix + name); err != nil {
			return nil, openurl.Invalid("name", "redislock: layout=plain: %w", err)
		}
	}
	return &r, nil
}

// CheckName implements driver.NameChecker: in LayoutPlain a name whose key
// has '{' or '}' that form no Redis Cluster hash tag is refused, since no
// other key could share its slot. Every name is accepted in LayoutDlock.
func (d *Driver) CheckName(name string) error {
	if !d.plain {
		return nil
	}
	_, err := d.mutexKeys(name)
	return err
}

// errClosed is returned by calls made after Close began.
var errClosed = fmt.Errorf("redislock: %w", dlock.ErrClosed)

// TryAcquire takes, re-enters or is refused the lock in one script call.
// A refusal is a *driver.LockedError whose RetryAfter is the key's remaining
// PTTL: the holder's remaining lease plus its lock-delay. A free lock is
// refused too (RetryAfter and Token zero) while a live waiter is queued for
// it (see Acquire): it goes to that waiter.
//
// A key that dlock did not write, of any type, at the lock's key (or at its
// fencing counter while the lock is free) is a lock held by an unknown
// owner: it is never overwritten, and the refusal's RetryAfter is that key's
// PTTL, or zero (unknown) when it has no expiry and is held until somebody
// deletes it.
//
// With Options.MinReplicas, a grant fewer replicas acknowledged in time is
// released and reported as an error wrapping ErrNotReplicated.
//
// After Close has begun it fails with an error wrapping dlock.ErrClosed; a
// grant that completes while Close runs is not returned but released by
// Close.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.Kind != driver.Exclusive {
		return d.tryKind(ctx, req)
	}
	r, err := d.mutexRef(req.Name)
	if err != nil {
		return driver.Grant{}, err
	}
	g, _, err := d.attempt(ctx, r, r.Keys(), req, 0, nil)
	return g, err
}

// attempt runs the acquire script once; wait > 0 queues a refused caller
// (see redisscript.AcquireQueued), and w, when not nil, is a waiter that
// asks for grants (the waiting acquire, see grant.go). foreign reports a
// refusal by a key dlock did not write. A grant's handle is ref, which the
// book keeps too; k is ref.Keys(), which a waiting Acquire builds once for
// all its attempts.
func (d *Driver) attempt(ctx context.Context, ref *redisscript.Ref, k redisscript.Keys, req driver.AcquireRequest, wait time.Duration, w *grantWaiter) (_ driver.Grant, foreign bool, _ error) {
	if !d.gate.Enter() {
		return driver.Grant{}, false, errClosed
	}
	defer d.gate.Exit()
	var r redisscript.AcquireResult
	var counter uint64
	var err error
	sent := time.Now()
	c, done := d.conn()
	defer done()
	var sc redis.Scripter = c
	ln := d.lane.Take()
	if ln != nil {
		sc = ln
	}
	if w != nil {
		r, counter, err = redisscript.AcquireWaiting(ctx, sc, k, req.Owner, req.TTL, req.LockDelay, wait, 0, d.grantCh)
	} else {
		r, err = redisscript.AcquireQueued(ctx, sc, k, req.Owner, req.TTL, req.LockDelay, wait)
	}
	if ln != nil {
		d.lane.Give(err)
	}
	if err != nil {
		// The outcome is unknown: the script may have run. Book it, so
		// that Close releases it if nobody does first (the dlock
		// package's clean-up Release removes it from the book).
		d.grants.GrantedRef(ref, req.Owner, req.TTL, sent)
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "redislock: acquire", err)
	}
	if !r.Granted {
		if w != nil {
			w.refused(sent, counter)
		}
		return driver.Grant{}, r.Foreign, &driver.LockedError{RetryAfter: r.PTTL, Token: r.Fence}
	}
	if w != nil {
		w.granted(r.Fence)
	}
	d.grants.GrantedRef(ref, req.Owner, req.TTL, sent)
	if err := d.replicated(ctx, c); err != nil {
		d.undo(ctx, func(ctx context.Context, c redis.UniversalClient) {
			if _, held, rerr := d.releaseMutex(ctx, c, k, req.Owner, r.Fence); rerr == nil {
				d.grants.Released(k.Lock, req.Owner, held)
			}
		})
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "redislock: acquire: granted, then released", err)
	}
	if d.gate.Stopped() {
		return driver.Grant{}, false, errGrantedClosing
	}
	return driver.Grant{Token: r.Fence, Count: r.Count, Sent: sent, Key: k.Lock, Handle: ref}, false, nil
}

// errGrantedClosing is returned for a grant made while Close began: Close
// releases it.
var errGrantedClosing = fmt.Errorf("redislock: acquire: granted while closing, released by Close: %w", dlock.ErrClosed)

// releaseMutex runs one mutex release on c: in the dlock layout the
// granting release (a freed lock goes to the first queued waiter if it
// asked for it and listens, see grant.go), in the plain layout the plain
// one.
func (d *Driver) releaseMutex(ctx context.Context, c redis.Scripter, k redisscript.Keys, owner string, token uint64) (int, bool, error) {
	if d.plain {
		return redisscript.Release(ctx, c, k, owner, token)
	}
	return redisscript.ReleaseGranting(ctx, c, k, owner, token)
}

// maxForeignPoll bounds how long a waiter for a lock a foreign client holds
// (a key dlock did not write) waits before it looks again: such a client
// publishes nothing when it releases.
const maxForeignPoll = 250 * time.Millisecond

// queueWait is how long a waiter's entry in a lock's queue lasts unless
// the waiter renews it; a waiter renews it (with another attempt) every
// queueWait/3. A waiter that vanished holds up the queue for at most this.
const queueWait = 3 * time.Second

// listenLinger is how long a lock's release channel stays subscribed after
// its last waiting Acquire returned (see redisscript.Hub.SetLinger): a lock
// taken in turn by the driver's callers costs no SUBSCRIBE and UNSUBSCRIBE
// per Lock, and its next waiting Acquire asks for a grant from its first
// attempt.
const listenLinger = 2 * time.Second

// Acquire waits for the lock in its queue on the server: waiters are
// granted in the order they first asked, whichever process they are in.
// The first attempt is TryAcquire's; once refused, the caller is queued and
// subscribed, and its later attempts ask to be granted the lock by the
// release that frees it (see grant.go): the release then hands it over with
// one message on the driver's grant channel. A release that cannot (no
// request, the driver not connected, the plain layout or MinReplicas), or
// a waiter leaving, wakes only the first live waiter, which takes the lock
// with one more script call. Meanwhile a
// waiter renews its queue entry every queueWait/3 with another attempt, and
// also tries when the holder's key would expire. TryAcquire (a caller that
// does not wait) and a releaser asking again go behind the queued waiters.
//
// When ctx ends or the driver closes, the waiter leaves the queue (waking
// the next one) and Acquire returns an error wrapping ctx.Err() or
// dlock.ErrClosed. A queue entry left behind by a crashed waiter is dropped
// after queueWait. Grant.Sent is when the granting attempt was sent.
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.Kind != driver.Exclusive {
		return d.acquireKind(ctx, req)
	}
	ref, err := d.mutexRef(req.Name)
	if err != nil {
		return driver.Grant{}, err
	}
	k := ref.Keys()
	var sig chan struct{} // made once refused: an uncontended Acquire needs none
	var sub *redisscript.Sub
	var gw *grantWaiter // set once it asks for grants (see grant.go)
	foreignPoll := 20 * time.Millisecond
	defer func() {
		if sub != nil {
			sub.Close(false)
		}
		if gw != nil {
			// A grant it was sent and did not use (it gave up, or an
			// attempt of its own came first) goes to the next waiter.
			if t := d.waiters.remove(k.Channel, req.Owner, gw); t != 0 {
				d.releaseGrant(k, req.Owner, t)
			}
		}
	}()
	if d.grantCh != "" && d.hub.Listening(k.Channel) && d.subscribeGrants(ctx) {
		// The channel is still subscribed from a recent waiting Acquire
		// (a hot lock): join it, and let the first attempt ask for grants.
		sig = make(chan struct{}, 1)
		if sub = d.hub.Join(k.Channel, req.Owner, sig); sub != nil {
			gw = d.waiters.add(k.Channel, req.Owner, sig)
		}
	}
	for attempts := 0; ; attempts++ {
		g, foreign, err := d.attempt(ctx, ref, k, req, queueWait, gw)
		if err == nil {
			return g, nil
		}
		var le *driver.LockedError
		if !errors.As(err, &le) {
			if attempts > 0 && !errors.Is(err, dlock.ErrClosed) {
				// Refused before, so any hold of this owner is this
				// attempt's own grant, if the script ran: release it.
				d.undoAttempt(ctx, k, req.Owner)
			}
			d.leave(ctx, k, req.Owner, gw != nil)
			return driver.Grant{}, err
		}
		if sig == nil {
			sig = make(chan struct{}, 1)
		}
		if sub == nil {
			if s, err := d.hub.SubscribeOwner(ctx, k.Channel, req.Owner, sig); err == nil {
				sub = s
				if d.grantCh != "" && d.subscribeGrants(ctx) {
					gw = d.waiters.add(k.Channel, req.Owner, sig)
				}
				continue // a release before the subscription is not missed
			}
		}
		wait := queueWait / 3
		if gw != nil {
			// A grant's lease counts from the last refused attempt:
			// renewing at least every TTL/4 leaves a grant more than
			// the two thirds of the TTL it must (see takeGrant).
			wait = min(wait, max(req.TTL/4, time.Millisecond))
		}
		if le.RetryAfter > 0 && le.RetryAfter+time.Millisecond < wait {
			wait = le.RetryAfter + time.Millisecond
		}
		if foreign {
			// A foreign holder publishes nothing when it lets go: look
			// again soon, backing off to maxForeignPoll.
			wait = min(wait, foreignPoll)
			foreignPoll = min(2*foreignPoll, maxForeignPoll)
		} else {
			foreignPoll = 20 * time.Millisecond
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			d.leave(ctx, k, req.Owner, gw != nil)
			return driver.Grant{}, ctxerr.Wrap(ctx, "redislock: acquire", ctx.Err())
		case <-d.stop:
			t.Stop()
			return driver.Grant{}, errClosed
		case <-sig:
			t.Stop()
			if gw != nil {
				switch g, ok, err := d.takeGrant(ref, k, req, gw); {
				case err != nil:
					return driver.Grant{}, err
				case ok:
					return g, nil
				}
			}
		case <-t.C:
		}
	}
}

// leave takes owner out of k's queue, best effort (a failure leaves the
// entry to expire); granting is set for a waiter that asked for grants,
// whose request goes too.
func (d *Driver) leave(ctx context.Context, k redisscript.Keys, owner string, granting bool) {
	d.detached(ctx, func(ctx context.Context) {
		if granting {
			_ = redisscript.LeaveGranting(ctx, d.client, k, owner)
		} else {
			_ = redisscript.Leave(ctx, d.client, k, owner)
		}
	})
}

// undoAttempt releases the grant an attempt of unknown outcome may have
// made; if it cannot, the grant stays booked for Close.
func (d *Driver) undoAttempt(ctx context.Context, k redisscript.Keys, owner string) {
	d.detached(ctx, func(ctx context.Context) {
		if _, held, err := d.releaseMutex(ctx, d.client, k, owner, 0); err == nil {
			d.grants.Released(k.Lock, owner, held)
		}
	})
}

// detached runs fn, unless Close has begun, with ctx's values but not its
// end, for at most five seconds.
func (d *Driver) detached(ctx context.Context, fn func(context.Context)) {
	if !d.gate.Enter() {
		return
	}
	defer d.gate.Exit()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	fn(dctx)
}

// Release gives up one hold. The last hold frees the lock at once: in the
// dlock layout it is granted to the first queued waiter if that waiter
// asked for it and its driver listens (see Acquire), else it is deleted and
// its release channel published.
// After Close has begun it fails with an error wrapping dlock.ErrClosed
// (Close has released, or is releasing, every grant of the driver).
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if !d.gate.Enter() {
		return 0, errClosed
	}
	defer d.gate.Exit()
	if l.Kind != driver.Exclusive {
		return d.releaseKind(ctx, l)
	}
	k := d.keys(l.Name, l.Handle)
	var remaining int
	var held bool
	var err error
	if ln := d.lane.Take(); ln != nil {
		remaining, held, err = d.releaseMutex(ctx, ln, k, l.Owner, l.Token)
		d.lane.Give(err)
	} else {
		remaining, held, err = d.releaseMutex(ctx, d.client, k, l.Owner, l.Token)
	}
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "redislock: release", err)
	}
	d.grants.Released(k.Lock, l.Owner, held)
	if !held {
		return 0, driver.ErrNotHeld
	}
	return remaining, nil
}

// Renew extends every lease in one round trip (see the package doc). A
// key dlock did not write is not held. With Options.MinReplicas the
// renewals are followed by one WAIT on the same connection, and when fewer
// replicas acknowledged them in time each renewed lease's error wraps
// ErrNotReplicated: not confirmed. After Close has begun it fails with
// an error wrapping dlock.ErrClosed.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if !d.gate.Enter() {
		return nil, errClosed
	}
	defer d.gate.Exit()
	items := make([]redisscript.RenewItem, len(ls))
	ids := make([]string, len(ls)) // the grants' keys in the book
	for i, l := range ls {
		items[i] = redisscript.RenewItem{Owner: l.Owner, Token: l.Token, TTL: l.TTL}
		switch l.Kind {
		case driver.Exclusive:
			items[i].Lock = d.lockKey(l.Name, l.Handle)
		case driver.Write:
			items[i].Lock = d.kindKeys(l).Writer
		default:
			kk := d.kindKeys(l)
			items[i].Holders, items[i].Values = kk.Holders, kk.Values
		}
		ids[i] = items[i].Lock
		if l.Kind != driver.Exclusive {
			ids[i] = d.kindKeys(l).ID()
		}
	}
	c, done := d.conn()
	defer done()
	sent := time.Now()
	var rc redisscript.Pipeliner = c
	if cc, ok := c.(connClient); ok {
		rc = cc.conn // one connection, whose renewals go in chunks as on a *redis.Client
	}
	errs, err := redisscript.Renew(ctx, rc, items)
	if err != nil {
		return nil, ctxerr.Wrap(ctx, "redislock: renew", err)
	}
	if slices.Contains(errs, nil) {
		if err := d.replicated(ctx, c); err != nil {
			notReplicatedRenewals(errs, err)
		}
	}
	for i, e := range errs {
		switch {
		case e == nil:
			d.grants.Renewed(ids[i], items[i].Owner, items[i].TTL, sent, true)
		case errors.Is(e, driver.ErrNotHeld):
			d.grants.Renewed(ids[i], items[i].Owner, items[i].TTL, sent, false)
		default:
			errs[i] = ctxerr.Wrap(ctx, "redislock: renew", e)
		}
	}
	return errs, nil
}

// Subscribe registers for release notifications of name. It costs no round
// trip: the driver's one pub/sub connection is shared by every waiter, each
// channel is subscribed once however many goroutines wait on it, and the
// SUBSCRIBE is written without waiting for the reply (the subscription
// wakes its waiter once the server confirms it, so a release that slipped in
// before is not missed).
//
// A release wakes one waiter of this driver, the one waiting longest; a
// waiter that closes its subscription with a wake-up unconsumed passes it
// on. Every driver (process) waiting on the name is woken once.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	sig := make(chan struct{}, 1)
	k, err := d.mutexKeys(name)
	if err != nil {
		return nil, err
	}
	s, err := d.hub.Subscribe(ctx, k.Channel, sig)
	if err != nil {
		return nil, ctxerr.Wrap(ctx, "redislock: subscribe", err)
	}
	return redisscript.NewSubscription(sig, s), nil
}

// Inspect lists the locks whose names start with prefix, free ones that
// were once taken included (they keep their fencing counter). ExpiresIn is
// the time until the lock frees itself if nobody renews or releases it,
// lock-delay included. Waiters is the length of the lock's waiter queue
// (see Acquire). A name's read/write lock (Kind Write: Owner and Count are
// the writer's, or Readers the live readers and Count their holds, Waiters
// the waiting writers) and semaphore (Kind Permit: Permits its stored
// count, Holders the live holders, Count their holds) are listed after its
// mutex, once used (their fencing counters stay). A name held by a key dlock
// did not write is shown with Owner "?" (redisscript.ForeignOwner), Token 0,
// Count 1 and ExpiresIn that key's PTTL, negative when it has none. It SCANs
// the key space (on every primary of a cluster), so it is meant for status
// output, not for hot paths. In LayoutPlain it lists the keys that have
// dlock's fencing counter beside them (every key dlock ever granted): a
// foreign client's hold of such a key shows as "?"; a key only foreign
// clients ever locked is not listed.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if !d.gate.Enter() {
		return nil, errClosed
	}
	defer d.gate.Exit()
	inspect := redisscript.Inspect
	if d.plain {
		inspect = redisscript.InspectPlain
	}
	nodes, err := inspect(ctx, d.client, d.prefix, prefix)
	if err != nil {
		return nil, ctxerr.Wrap(ctx, "redislock: inspect", err)
	}
	out := make([]driver.LockInfo, len(nodes))
	for i, n := range nodes {
		out[i] = driver.LockInfo{Name: n.Name, Owner: n.Owner, Token: n.Fence, Count: n.Count, ExpiresIn: n.PTTL, Waiters: n.Waiters,
			Kind: n.Kind, Readers: n.Readers, Permits: n.Permits, Holders: n.Holders}
		if n.Foreign {
			out[i].Owner = redisscript.ForeignOwner
		}
	}
	return out, nil
}

// Limits reports millisecond TTL granularity (PX).
func (d *Driver) Limits() driver.Limits {
	return driver.Limits{MinTTL: time.Millisecond, TTLGranularity: time.Millisecond}
}

// Close refuses new calls, waits for the calls in flight, releases every
// grant the driver handed out (or was completing) that has not been
// released, then stops the driver's pub/sub connection. It closes the
// go-redis client only if the driver opened it from a URL. So no lock the
// driver granted outlives Close, even one whose grant raced it; Close
// reports an error when such a release failed (that lock then expires by
// its TTL). Each call in flight is bounded by its context and the client's
// timeouts. Close is idempotent.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		d.stopWaiters()
		d.gate.Stop()
		if err := d.grants.ReleaseAll([]redis.UniversalClient{d.client}); err != nil {
			d.closeErr = fmt.Errorf("redislock: close: %w", err)
		}
		d.lane.Close()
		if err := d.hub.Close(); d.closeErr == nil {
			d.closeErr = err
		}
		if d.own {
			if err := d.client.Close(); d.closeErr == nil {
				d.closeErr = err
			}
		}
	})
	return d.closeErr
}

// stopWaiters wakes every Acquire waiting, to return ErrClosed.
func (d *Driver) stopWaiters() { d.stopOnce.Do(func() { close(d.stop) }) }

// kill drops every connection at once without releasing anything, as a
// crashed process would. For tests.
func (d *Driver) kill() {
	d.stopWaiters()
	_ = d.hub.Close()
	d.lane.Close()
	_ = d.client.Close()
	d.gate.Stop()
	d.grants.Forget()
}

// RaiseFence makes the next grant of kind k of name carry a token greater
// than atLeast (driver.FenceRaiser): it raises that kind's fencing counter
// (the mutex's, the read/write lock's shared one, or the semaphore's) to
// atLeast if it is lower, in one script call, and never touches a holder's
// grant. A key dlock did not write at the counter is left alone and the
// call fails. With Options.MinReplicas it fails (wrapping ErrNotReplicated)
// when fewer replicas acknowledged the raise in time. After Close has begun it fails with an error wrapping
// dlock.ErrClosed.
func (d *Driver) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	if err := redisscript.CheckKind(k); err != nil {
		return fmt.Errorf("redislock: raise fence: %w", err)
	}
	if !d.gate.Enter() {
		return errClosed
	}
	defer d.gate.Exit()
	c, done := d.conn()
	defer done()
	fence := redisscript.FenceKey(d.prefix, name, k)
	if k == driver.Exclusive {
		mk, err := d.mutexKeys(name)
		if err != nil {
			return err
		}
		fence = mk.Fence
	} else if d.plain {
		return fmt.Errorf("redislock: raise fence of a %v lock: layout=plain serves mutexes only: %w", k, driver.ErrUnsupported)
	}
	if err := redisscript.RaiseFence(ctx, c, fence, atLeast); err != nil {
		return ctxerr.Wrap(ctx, "redislock: raise fence", err)
	}
	if err := d.replicated(ctx, c); err != nil {
		return ctxerr.Wrap(ctx, "redislock: raise fence", err)
	}
	return nil
}
