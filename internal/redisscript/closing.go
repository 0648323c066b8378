package redisscript

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
)

// Gate lets a driver's Close wait for the calls in flight and refuse new
// ones, so that nothing is granted after Close has released what the
// driver holds, and no call runs on a client Close has closed.
//
// The zero Gate is open. It is safe for concurrent use.
type Gate struct {
	mu      sync.RWMutex // orders wg.Add in Enter before wg.Wait in Stop
	stopped bool
	wg      sync.WaitGroup
}

// Enter admits one call and reports true, or reports false once Stop has
// begun. Every admitted call must end with Exit.
func (g *Gate) Enter() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	return true
}

// Exit ends a call admitted by Enter.
func (g *Gate) Exit() { g.wg.Done() }

// Add counts n more pieces of work that Stop waits for (goroutines an
// admitted call starts and may leave running). It must be called only
// between an admitted call's Enter and its Exit; each piece ends with Done.
func (g *Gate) Add(n int) { g.wg.Add(n) }

// Done ends one piece of work counted by Add.
func (g *Gate) Done() { g.wg.Done() }

// Stopped reports whether Stop has begun. A call that was admitted and
// sees it true must not hand out what it got: Stop's caller will undo it.
func (g *Gate) Stopped() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.stopped
}

// Stop refuses new calls and waits for the admitted ones (and the work
// they added) to end. It may be called more than once.
func (g *Gate) Stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.wg.Wait()
}

// Held is one lock a driver granted and nobody has released yet.
type Held struct {
	Keys  Keys     // a mutex's keys (Kind.Kind is Exclusive)
	Kind  KindKeys // the keys of a read/write lock or semaphore grant
	Owner string
	Holds int           // holds this driver granted (re-entries count)
	TTL   time.Duration // of the last grant or renewal
}

// Grants is a driver's book of the grants it handed out and that were not
// released since, so that Close can release whatever the dlock package did
// not (a grant still in flight when the client closed, a release that
// failed). Entries past their lease are dropped as the book grows, so
// leases that were lost and never released do not pile up.
//
// An entry is small (it is kept for every held lease): the lock's keys by
// a pointer the driver may share with the grant's handle (GrantedRef), the
// hold count and the lease's end.
//
// The zero Grants is empty and ready. It is safe for concurrent use.
type Grants struct {
	mu   sync.Mutex
	m    map[grantKey]grantEntry
	next int // prune when the book reaches this size
}

type grantKey struct{ lock, owner string }

type grantEntry struct {
	keys  any // *Ref, *Keys or *KindKeys
	holds int32
	ttlMs int32         // of the last grant or renewal, whole ms, rounded up
	until time.Duration // since epoch: the local time by which the lease has surely ended
}

// epoch is the origin of grantEntry.until, a monotonic clock reading.
var epoch = time.Now()

// sinceEpoch is t on the clock of grantEntry.until.
func sinceEpoch(t time.Time) time.Duration { return t.Sub(epoch) }

// ttlMillis is ttl in whole milliseconds, rounded up, for grantEntry.ttlMs.
func ttlMillis(ttl time.Duration) int32 {
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	return int32(min(max(ms, 0), 1<<31-1))
}

// grace is added to a lease's local end before its entry counts as stale:
// the server counts the TTL from a little later than the local send time.
const grace = time.Second

// minPrune is the smallest book size that is ever pruned.
const minPrune = 1024

// Granted records one more hold of k by owner, granted by a request sent at
// sent with lease ttl.
func (g *Grants) Granted(k Keys, owner string, ttl time.Duration, sent time.Time) {
	if g.rebook(k.Lock, owner, ttl, sent) {
		return
	}
	kc := k
	g.book(k.Lock, owner, ttl, sent, &kc)
}

// GrantedRef is Granted for the keys r refers to; the book keeps r itself,
// which the caller must not change.
func (g *Grants) GrantedRef(r *Ref, owner string, ttl time.Duration, sent time.Time) {
	g.book(r.Lock(), owner, ttl, sent, r)
}

// GrantedKind is Granted for a grant of kind kk.Kind (not Exclusive): it is
// booked under kk.ID().
func (g *Grants) GrantedKind(kk KindKeys, owner string, ttl time.Duration, sent time.Time) {
	id := kk.ID()
	if g.rebook(id, owner, ttl, sent) {
		return
	}
	kc := kk
	g.book(id, owner, ttl, sent, &kc)
}

// rebook is book for an entry that exists already; it reports false,
// booking nothing, when there is none.
func (g *Grants) rebook(id, owner string, ttl time.Duration, sent time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := grantKey{id, owner}
	e, ok := g.m[key]
	if ok {
		e.holds++
		e.ttlMs, e.until = ttlMillis(ttl), sinceEpoch(sent)+ttl
		g.m[key] = e
	}
	return ok
}

// book records one more hold of id by owner; keys (*Ref, *Keys or
// *KindKeys) are kept when the entry is new.
func (g *Grants) book(id, owner string, ttl time.Duration, sent time.Time, keys any) {
	until := sinceEpoch(sent) + ttl
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[grantKey]grantEntry{}
	}
	key := grantKey{id, owner}
	e, ok := g.m[key]
	if !ok {
		if len(g.m) >= max(g.next, minPrune) {
			g.prune(time.Now())
		}
		e.keys = keys
	}
	e.holds++
	e.ttlMs = ttlMillis(ttl)
	e.until = until
	g.m[key] = e
}

func (g *Grants) prune(now time.Time) {
	t := sinceEpoch(now) - grace
	for k, e := range g.m {
		if t > e.until {
			delete(g.m, k)
		}
	}
	g.next = 2 * len(g.m)
}

// Has reports whether the book holds a grant of lock by owner.
func (g *Grants) Has(lock, owner string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.m[grantKey{lock, owner}]
	return ok
}

// Released records the outcome of a release of one hold of lock by owner:
// held is false when the server said the owner did not hold it.
func (g *Grants) Released(lock, owner string, held bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := grantKey{lock, owner}
	e, ok := g.m[key]
	if !ok {
		return
	}
	if e.holds--; !held || e.holds <= 0 {
		delete(g.m, key)
		return
	}
	g.m[key] = e
}

// Renewed records a renewal of lock by owner sent at sent: ok is true when
// renewed, false when the server said the owner no longer holds it.
func (g *Grants) Renewed(lock, owner string, ttl time.Duration, sent time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := grantKey{lock, owner}
	e, found := g.m[key]
	if !found {
		return
	}
	if !ok {
		delete(g.m, key)
		return
	}
	e.ttlMs = ttlMillis(ttl)
	e.until = sinceEpoch(sent) + ttl
	g.m[key] = e
}

// Take empties the book and returns the grants whose lease may still be
// alive.
func (g *Grants) Take() []Held {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := sinceEpoch(time.Now()) - grace
	var out []Held
	for key, e := range g.m {
		if t > e.until {
			continue
		}
		h := Held{Owner: key.owner, Holds: int(e.holds), TTL: time.Duration(e.ttlMs) * time.Millisecond}
		switch k := e.keys.(type) {
		case *Ref:
			h.Keys = k.Keys()
		case *Keys:
			h.Keys = *k
		case *KindKeys:
			h.Kind = *k
		}
		out = append(out, h)
	}
	g.m = nil
	return out
}

// Forget empties the book without releasing anything (a crash, for tests).
func (g *Grants) Forget() {
	g.mu.Lock()
	g.m = nil
	g.mu.Unlock()
}

// ReleaseAll empties the book (Take) and gives up what it held on every
// client in clients (one per Redlock node), in parallel, within
// closeTimeout. It returns nil when every release was answered; otherwise
// an error naming how many locks were still held and the first failure
// (with its node's index when there are several clients): those locks then
// expire by their TTL there. Drivers call it from Close, after their Gate
// has stopped.
func (g *Grants) ReleaseAll(clients []redis.UniversalClient) error {
	hs := g.Take()
	if len(hs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout(hs))
	defer cancel()
	errs := OnEach(clients, func(c redis.UniversalClient) error { return releaseHeld(ctx, c, hs) })
	for i, err := range errs {
		switch {
		case err == nil:
		case len(clients) == 1:
			return fmt.Errorf("releasing %d lock(s) still held: %w", len(hs), err)
		default:
			return fmt.Errorf("releasing %d lock(s) still held: node %d: %w", len(hs), i, err)
		}
	}
	return nil
}

// closeTimeout bounds the release of the grants a driver still holds when
// it closes: the longest TTL among them (a lock is gone by then anyway), at
// most five seconds.
func closeTimeout(hs []Held) time.Duration {
	var d time.Duration
	for _, h := range hs {
		d = max(d, h.TTL)
	}
	return min(max(d, 10*time.Millisecond), 5*time.Second)
}

// releaseHeld gives up every hold in hs on the server(s) behind c, in one
// pipeline, publishing on each lock's release channel when it becomes
// free. A hold that is no longer there is not an error. It returns the
// first error of a release whose outcome is unknown.
func releaseHeld(ctx context.Context, c redis.UniversalClient, hs []Held) error {
	if len(hs) == 0 {
		return nil
	}
	pipe := c.Pipeline()
	var cmds []*redis.Cmd
	for _, h := range hs {
		for range max(h.Holds, 1) {
			switch kk := h.Kind; kk.Kind {
			case driver.Write:
				cmds = append(cmds, pipe.Eval(ctx, writeReleaseSrc, []string{kk.Writer}, h.Owner, "0", kk.Channel))
			case driver.Read:
				cmds = append(cmds, pipe.Eval(ctx, setReleaseSrc, []string{kk.Holders, kk.Values}, h.Owner, "0", kk.Channel, "r"))
			case driver.Permit:
				cmds = append(cmds, pipe.Eval(ctx, setReleaseSrc, []string{kk.Holders, kk.Values}, h.Owner, "0", kk.Channel, "p"))
			default:
				cmds = append(cmds, pipe.Eval(ctx, releaseSrc, h.Keys.releaseKeys(), h.Owner, strconv.Itoa(0), h.Keys.Channel))
			}
		}
	}
	_, _ = pipe.Exec(ctx)
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return err
		}
	}
	return nil
}

// OnEach runs fn on every element of xs at once (one goroutine each), waits
// for all of them, and returns their errors in the order of xs.
func OnEach[T any](xs []T, fn func(T) error) []error {
	errs := make([]error, len(xs))
	var wg sync.WaitGroup
	for i, x := range xs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(x)
		}()
	}
	wg.Wait()
	return errs
}
