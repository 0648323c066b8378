package redislock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

// sentinelURL is the set's URL with the master's password and params.
func sentinelURL(s *testserver.SentinelSet, params string) string {
	u := s.URL()
	if p := s.Password(); p != "" {
		u += "&password=" + url.QueryEscape(p)
	}
	if params != "" {
		u += "&" + params
	}
	return u
}

func TestSentinelURL(t *testing.T) {
	u, err := url.Parse("redis-sentinel://su:spw@h3,127.0.0.1:1,127.0.0.1:2/3?master_name=m&password=mpw&key_prefix=p:&min_replicas=2&replica_timeout=250ms&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	fo, o, err := parseSentinelURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(fo.SentinelAddrs, ","); got != "h3:26379,127.0.0.1:1,127.0.0.1:2" {
		t.Errorf("sentinels %s", got)
	}
	if fo.MasterName != "m" || fo.DB != 3 || fo.Password != "mpw" || fo.SentinelUsername != "su" || fo.SentinelPassword != "spw" ||
		fo.DialTimeout != 2*time.Second || fo.MaxRetries != -1 || !fo.ContextTimeoutEnabled || fo.TLSConfig != nil || fo.Dialer != nil {
		t.Errorf("failover options %+v", fo)
	}
	if o.KeyPrefix != "p:" || o.MinReplicas != 2 || o.ReplicaTimeout != 250*time.Millisecond {
		t.Errorf("options %+v", o)
	}
	u, _ = url.Parse("redis-sentinel://127.0.0.1:1/0?master_name=m&layout=plain")
	if _, o, err := parseSentinelURL(u); err != nil || o.Layout != LayoutPlain {
		t.Errorf("layout=plain: %+v, %v", o, err)
	}
	u, _ = url.Parse("redis-sentinel://127.0.0.1:1/0?master_name=m&ca_file=&tls=true")
	if _, _, err := parseSentinelURL(u); err == nil {
		t.Error("empty ca_file accepted")
	}
	u, _ = url.Parse("redis-sentinel://127.0.0.1:1/0?master_name=m&tls=true&skip_verify=true")
	fo, _, err = parseSentinelURL(u)
	if err != nil || fo.Dialer == nil || fo.TLSConfig != nil {
		t.Errorf("tls=true: dialer %v, TLSConfig %v, err %v; want our dialer", fo.Dialer != nil, fo.TLSConfig, err)
	}
	for _, bad := range []string{
		"redis-sentinel://127.0.0.1:1/0",                                             // no master_name
		"redis-sentinel:///0?master_name=m",                                          // no sentinels
		"redis-sentinel://127.0.0.1:1,/0?master_name=m",                              // empty address
		"redis-sentinel://127.0.0.1:1/0?master_name=m&min_replicas=-1",               // negative
		"redis-sentinel://127.0.0.1:1/0?master_name=m&min_replicas=x",                // not a number
		"redis-sentinel://127.0.0.1:1/0?master_name=m&replica_timeout=0s",            // WAIT 0 waits forever
		"redis-sentinel://127.0.0.1:1/0?master_name=m&no_such_option=1&password=s3c", // go-redis refuses it
		"redis-sentinel://127.0.0.1:1/x?master_name=m&password=s3c",                  // bad db
		"redis-sentinel://127.0.0.1:1/0?master_name=m&layout=flat&password=s3c",      // unknown layout
	} {
		_, err := dlock.Open(context.Background(), bad)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%s) = %v, want ErrInvalid", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3c") {
			t.Errorf("Open(%s): error shows the password: %v", bad, err)
		}
	}
	// redis:// takes min_replicas too.
	u, _ = url.Parse("redis://127.0.0.1:1/0?min_replicas=1&replica_timeout=2s")
	if _, o, err := parseURL(u); err != nil || o.MinReplicas != 1 || o.ReplicaTimeout != 2*time.Second {
		t.Errorf("redis:// min_replicas: %+v, %v", o, err)
	}
}

// TestMinReplicasNeedsOneMaster: MinReplicas is refused for clients that
// are not one master's.
func TestMinReplicasNeedsOneMaster(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer single.Close()
	if _, err := New(ring, &Options{MinReplicas: 1}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("New(ring, MinReplicas 1) = %v, want ErrInvalid", err)
	}
	if _, err := New(single, &Options{MinReplicas: -1}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("MinReplicas -1: %v, want ErrInvalid", err)
	}
	if _, err := New(single, &Options{MinReplicas: 1, ReplicaTimeout: time.Microsecond}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("ReplicaTimeout 1µs: %v, want ErrInvalid", err)
	}
}

// TestSentinelFailover: across a failover (master killed, a replica
// promoted by Sentinel) a lock granted with min_replicas=1 stays held with
// its token, its lease keeps renewing on the new master, Inspect finds it
// there, a waiter's pub/sub subscription moves to the new master and is
// woken by the release, and the next grant's token is larger.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	set := testserver.RedisSentinel(t, &testserver.SentinelOptions{Password: "pw"})
	ctx := context.Background()
	raw := sentinelURL(set, "min_replicas=1&replica_timeout=2s")
	a, err := dlock.Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	u, _ := url.Parse(raw)
	dd, err := OpenSentinelURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	d := dd.(*Driver)
	defer d.Close()

	const ttl = 10 * time.Second
	la, err := a.NewMutex("held", &dlock.MutexOptions{TTL: ttl}).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := d.Subscribe(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	channel := redisscript.KeysFor(DefaultKeyPrefix, "held").Channel
	subscribers := func(node int) int64 {
		c := set.Client(node)
		defer c.Close()
		n, err := c.PubSubNumSub(ctx, channel).Result()
		if err != nil {
			return -1
		}
		return n[channel]
	}
	testwait.Until(t, 10*time.Second, "the waiter subscribed on the master", func() bool { return subscribers(0) == 1 })

	killed := time.Now()
	old, promoted, err := set.Failover(60 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d killed, node %d promoted, set steady after %v", old, promoted, time.Since(killed))
	select {
	case <-la.Done():
		t.Fatalf("the lease was lost in the failover: %v", la.Err())
	default:
	}
	infos, err := d.Inspect(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Owner != la.Owner() || infos[0].Token != la.Token() {
		t.Fatalf("Inspect on the new master = %+v, want held by %s with token %d", infos, la.Owner(), la.Token())
	}
	testwait.Until(t, 20*time.Second, "a renewal confirmed by the new master", func() bool {
		return time.Now().Add(la.ValidFor()).After(killed.Add(ttl + time.Second))
	})
	testwait.Until(t, 20*time.Second, "the waiter re-subscribed on the new master", func() bool { return subscribers(promoted) == 1 })
	for drained := false; !drained; { // wake-ups of the reconnection
		select {
		case <-sub.C():
		default:
			drained = true
		}
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	case <-time.After(10 * time.Second):
		t.Fatal("the release on the new master did not wake the waiter")
	}
	lb, err := a.NewMutex("held", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("token after the failover %d, before %d: not increasing", lb.Token(), la.Token())
	}
	_ = lb.Unlock(ctx)
}

// stallReplicas is testserver.SentinelSet.StallReplicas for t.
func stallReplicas(t *testing.T, set *testserver.SentinelSet, m int) (resume func()) {
	t.Helper()
	resume, err := set.StallReplicas(m)
	if err != nil {
		t.Fatal(err)
	}
	return resume
}

// lossRound is what one stalled failover did to a grant.
type lossRound struct {
	granted     bool  // the grant during the stall was handed out
	grantErr    error // or its error
	overlap     bool  // a second holder was granted while the first still held
	repeated    bool  // the second holder's token was not above the first's
	keptLost    bool  // a lock granted before the stall was free after the failover
	promotedFor time.Duration
}

// stalledFailover grants lock name to a while the replicas are stalled,
// kills the master, lets Sentinel promote a replica, then has b ask for the
// same lock, and for kept (granted to a before the stall).
func stalledFailover(t *testing.T, set *testserver.SentinelSet, a, b *dlock.Client, name string) lossRound {
	t.Helper()
	ctx := context.Background()
	const ttl = 20 * time.Second
	var r lossRound
	kept, err := a.NewMutex(name+"-kept", &dlock.MutexOptions{TTL: ttl}).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := set.Master()
	if err != nil {
		t.Fatal(err)
	}
	resume := stallReplicas(t, set, m)
	la, err := a.NewMutex(name, &dlock.MutexOptions{TTL: ttl}).TryLock(ctx)
	r.granted, r.grantErr = err == nil, err
	killed := time.Now()
	if err := set.Nodes[m].Kill(); err != nil {
		resume()
		t.Fatal(err)
	}
	resume()
	promoted, err := set.AwaitPromotion(m, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r.promotedFor = time.Since(killed)
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lb, err := b.NewMutex(name, &dlock.MutexOptions{TTL: ttl}).Lock(lctx)
	if err != nil {
		t.Fatalf("lock %s after the failover: %v", name, err)
	}
	if r.granted {
		r.overlap = la.ValidFor() > 0 // a still believes it holds the lock
		r.repeated = lb.Token() <= la.Token()
		t.Logf("%s: a granted token %d during the stall; after the failover b granted token %d while a's lease had %v left",
			name, la.Token(), lb.Token(), la.ValidFor().Round(time.Millisecond))
	}
	if lk, err := b.NewMutex(name+"-kept", nil).TryLock(ctx); err == nil {
		r.keptLost = true
		_ = lk.Unlock(ctx)
	} else if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("trylock %s-kept: %v", name, err)
	}
	_ = lb.Unlock(ctx)
	if la != nil {
		_ = la.Unlock(ctx)
	}
	_ = kept.Unlock(ctx)
	if err := set.Rejoin(m, promoted); err != nil {
		t.Fatal(err)
	}
	if err := set.Settle(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSentinelStalledFailover measures the loss the seed describes: a
// grant the master acknowledged before any replica had it, then a failover.
// Without min_replicas the grant is handed out and lost: a second holder is
// granted the lock, with the same token, while the first still holds it.
// With min_replicas=1 the grant is refused (ErrNotReplicated, released) and
// a lock acknowledged before the stall survives the failover.
func TestSentinelStalledFailover(t *testing.T) {
	t.Parallel()
	set := testserver.RedisSentinel(t, &testserver.SentinelOptions{Password: "pw"})
	ctx := context.Background()
	for _, mode := range []struct{ name, params string }{
		{"async", ""},
		{"min_replicas=1", "min_replicas=1&replica_timeout=300ms"},
	} {
		a, err := dlock.Open(ctx, sentinelURL(set, mode.params))
		if err != nil {
			t.Fatal(err)
		}
		b, err := dlock.Open(ctx, sentinelURL(set, mode.params))
		if err != nil {
			t.Fatal(err)
		}
		r := stalledFailover(t, set, a, b, "stall-"+strings.ReplaceAll(mode.name, "=", ""))
		_ = a.Close()
		_ = b.Close()
		t.Logf("%s: granted during the stall %v (err %v), two holders %v, token repeated %v, earlier lock lost %v; promotion took %v",
			mode.name, r.granted, r.grantErr, r.overlap, r.repeated, r.keptLost, r.promotedFor.Round(time.Millisecond))
		switch mode.name {
		case "async":
			if !r.granted || !r.overlap || !r.repeated {
				t.Errorf("async replication: the stalled grant should be lost in the failover (two holders, a repeated token); got %+v", r)
			}
		default:
			if r.granted || !errors.Is(r.grantErr, ErrNotReplicated) {
				t.Errorf("min_replicas=1: a grant no replica acknowledged was handed out (err %v)", r.grantErr)
			}
			if r.overlap || r.repeated || r.keptLost {
				t.Errorf("min_replicas=1: %+v", r)
			}
		}
	}
}

// contentionResult counts what the checker's safety classes count.
type contentionResult struct {
	grants, overlaps, duplicates, regressions, errors int
	// spontaneous counts the failovers Sentinel made on its own, of a live
	// master (see testserver.SentinelOptions.DownAfter).
	spontaneous int
}

type heldSpan struct {
	name          string
	token         uint64
	lease         string // owner
	sent, granted time.Time
	end           time.Time
}

// contend runs clients × 2 goroutines locking two names (TTL 2s, holds of
// 2-20ms) while stalled failovers kill the master rounds times, and counts
// overlapping holds, tokens granted twice and tokens not above one granted
// before the request was sent.
func contend(t *testing.T, set *testserver.SentinelSet, params, prefix string, rounds int) contentionResult {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	var spans []heldSpan
	var res contentionResult
	var wg sync.WaitGroup
	names := []string{prefix + "-0", prefix + "-1"}
	for c := range 3 {
		cl, err := dlock.Open(context.Background(), sentinelURL(set, params)+"&ttl=2s&wait_max=200ms")
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					name := names[(c+g+i)%2]
					sent := time.Now()
					lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					l, err := cl.NewMutex(name, nil).Lock(lctx)
					cancel()
					if err != nil {
						if ctx.Err() == nil {
							mu.Lock()
							res.errors++
							mu.Unlock()
						}
						continue
					}
					sp := heldSpan{name: name, token: l.Token(), lease: l.Owner(), sent: sent, granted: time.Now()}
					pause := time.NewTimer(time.Duration(2+(c*7+g*5+i)%18) * time.Millisecond) // the critical section
					select {
					case <-pause.C:
					case <-l.Done():
						pause.Stop()
					}
					sp.end = time.Now()
					if l.Err() != nil {
						sp.end = sp.granted // lost at once: count nothing as held
					}
					_ = l.Unlock(context.Background())
					mu.Lock()
					spans = append(spans, sp)
					mu.Unlock()
				}
			}()
		}
	}
	failovers0 := set.Failovers()
	for r := range rounds {
		testwait.Until(t, 20*time.Second, "grants before the failover", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(spans) > 20*(r+1)
		})
		m, err := set.Master()
		if err != nil {
			t.Fatal(err)
		}
		resume := stallReplicas(t, set, m)
		time.Sleep(300 * time.Millisecond) // the fault: grants keep coming while no replica gets them
		if err := set.Nodes[m].Kill(); err != nil {
			resume()
			t.Fatal(err)
		}
		resume()
		promoted, err := set.AwaitPromotion(m, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := set.Rejoin(m, promoted); err != nil {
			t.Fatal(err)
		}
		if err := set.Settle(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	n := len(spans)
	mu.Unlock()
	testwait.Until(t, 20*time.Second, "grants after the last failover", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(spans) > n+20
	})
	stop()
	wg.Wait()
	res.grants = len(spans)
	res.spontaneous = set.Failovers() - failovers0 - rounds
	seen := map[string]map[uint64]string{}
	for i, a := range spans {
		if seen[a.name] == nil {
			seen[a.name] = map[uint64]string{}
		}
		if o, dup := seen[a.name][a.token]; dup && o != a.lease {
			res.duplicates++
		}
		seen[a.name][a.token] = a.lease
		regressed := false
		for j, b := range spans {
			if i == j || a.name != b.name {
				continue
			}
			if a.lease != b.lease && a.granted.Before(b.end) && b.granted.Before(a.end) && i < j {
				res.overlaps++
			}
			if b.granted.Before(a.sent) && a.token <= b.token {
				regressed = true
			}
		}
		if regressed {
			res.regressions++
		}
	}
	return res
}

// TestSentinelFailoverContention: three clients × two goroutines contend
// for two locks while the master is killed (with its replicas stalled, so
// the last grants reach none) twice. With min_replicas=1 no two holders
// overlap and no token repeats or goes back; with asynchronous replication
// the same faults hand out tokens twice (measured, and required to happen
// at least once, since the docs' claim rests on it).
func TestSentinelFailoverContention(t *testing.T) {
	t.Parallel()
	set := testserver.RedisSentinel(t, &testserver.SentinelOptions{Password: "pw"})
	safe := contend(t, set, "min_replicas=1&replica_timeout=300ms", "wait", 2)
	t.Logf("min_replicas=1, 2 stalled failovers (+%d Sentinel made on its own): %d grants, %d overlapping holds, %d tokens granted twice, %d tokens not above an earlier grant, %d failed Lock calls",
		safe.spontaneous, safe.grants, safe.overlaps, safe.duplicates, safe.regressions, safe.errors)
	switch {
	case safe.overlaps+safe.duplicates+safe.regressions == 0:
	case safe.spontaneous > 0:
		// Sentinel failed over a live master (the machine was too loaded
		// for down-after): the old master kept granting, acknowledged by
		// the replica that was then resynchronised from the promoted one.
		// WAIT for one of two replicas does not cover that (the docs say
		// so); min_replicas=2 would.
		t.Logf("min_replicas=1 lost grants in a failover Sentinel started on its own, of a live master: documented, not a failure")
	default:
		t.Errorf("min_replicas=1: %+v", safe)
	}
	async := contend(t, set, "", "async", 2)
	t.Logf("asynchronous, 2 stalled failovers (+%d Sentinel made on its own): %d grants, %d overlapping holds, %d tokens granted twice, %d tokens not above an earlier grant, %d failed Lock calls",
		async.spontaneous, async.grants, async.overlaps, async.duplicates, async.regressions, async.errors)
	if async.duplicates+async.regressions == 0 {
		t.Errorf("asynchronous replication lost no token in 2 stalled failovers: %+v", async)
	}
}

// TestMinReplicasStalled: with the replicas stopped (no WAIT can be
// acknowledged), every kind of grant fails with ErrNotReplicated and leaves
// nothing held, and a lease granted before loses its renewals: it ends
// locally (Done) although the master renewed it. Once the replicas are
// back, grants succeed again.
func TestMinReplicasStalled(t *testing.T) {
	t.Parallel()
	set := testserver.RedisSentinel(t, &testserver.SentinelOptions{Password: "pw"})
	ctx := context.Background()
	raw := sentinelURL(set, "min_replicas=1&replica_timeout=200ms")
	c, err := dlock.Open(ctx, raw+"&ttl=1500ms")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, _ := url.Parse(raw)
	dd, err := OpenSentinelURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer dd.Close()
	grants := func() []error {
		var errs []error
		try := func(l interface{ Unlock(context.Context) error }, err error) {
			errs = append(errs, err)
			if err == nil {
				_ = l.Unlock(ctx)
			}
		}
		try(c.NewMutex("m", nil).TryLock(ctx))
		try(c.NewRWMutex("rw", nil).TryRLock(ctx))
		try(c.NewRWMutex("rw", nil).TryLock(ctx))
		try(c.NewSemaphore("sem", 2, nil).TryAcquire(ctx))
		try(c.NewMultiMutex([]string{"m1", "m2"}, nil).TryLock(ctx))
		return errs
	}
	for i, err := range grants() {
		if err != nil {
			t.Fatalf("grant %d with the replicas up: %v", i, err)
		}
	}
	// Renewals of many leases go in chunked script calls on the one
	// connection their WAIT runs on, as on a plain client: counted by the
	// master's EVALSHA calls.
	d := dd.(*Driver)
	var ls []driver.Lease
	for i := range 1000 {
		req := driver.AcquireRequest{Name: fmt.Sprintf("many-%d", i), Owner: "o", TTL: 20 * time.Second}
		g, err := d.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, driver.Lease{Name: req.Name, Owner: "o", Token: g.Token, TTL: req.TTL, Handle: g.Handle})
	}
	m, err := set.Master()
	if err != nil {
		t.Fatal(err)
	}
	admin := set.Client(m)
	defer admin.Close()
	evalshas := func() int {
		txt, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, after, _ := strings.Cut(txt, "cmdstat_evalsha:calls=")
		n, _ := strconv.Atoi(strings.TrimRight(strings.SplitN(after, ",", 2)[0], "\r\n"))
		return n
	}
	for round := range 2 { // the first may load the script
		before := evalshas()
		errs, err := d.Renew(ctx, ls)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("renew %d: %v", i, e)
			}
		}
		if n := evalshas() - before; round == 1 && n > 2 {
			t.Errorf("renewing 1000 leases with MinReplicas took %d script calls, want 2 (chunks of 512)", n)
		}
	}
	held, err := c.NewMutex("renewed", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range set.Nodes {
		if i != m {
			if err := n.Pause(); err != nil {
				t.Fatal(err)
			}
			defer n.Resume()
		}
	}
	for i, err := range grants() {
		if !errors.Is(err, ErrNotReplicated) {
			t.Errorf("grant %d with the replicas stopped: %v, want ErrNotReplicated", i, err)
		}
	}
	infos, err := dd.(*Driver).Inspect(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name != "renewed" && !strings.HasPrefix(in.Name, "many-") && (in.Owner != "" || in.Readers > 0 || in.Holders > 0) {
			t.Errorf("left held after a refused grant: %+v", in)
		}
	}
	select {
	case <-held.Done():
		t.Logf("the lease ended: %v", held.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("a lease whose renewals no replica acknowledged was not lost")
	}
	for i, n := range set.Nodes {
		if i != m {
			_ = n.Resume()
		}
	}
	testwait.Until(t, 20*time.Second, "grants again once the replicas are back", func() bool {
		l, err := c.NewMutex("m", nil).TryLock(ctx)
		if err == nil {
			_ = l.Unlock(ctx)
		}
		return err == nil
	})
}

// BenchmarkMinReplicas measures what WAIT adds to a grant: TryAcquire then
// Release of a mutex on a master with two replicas, without and with
// min_replicas=1 (one more round trip, to the master and on to a replica's
// acknowledgement).
func BenchmarkMinReplicas(b *testing.B) {
	set := testserver.RedisSentinel(b, nil)
	ctx := context.Background()
	for _, mode := range []struct{ name, params string }{{"async", ""}, {"min_replicas=1", "min_replicas=1"}} {
		b.Run(mode.name, func(b *testing.B) {
			u, _ := url.Parse(sentinelURL(set, mode.params))
			d, err := OpenSentinelURL(ctx, u)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			req := driver.AcquireRequest{Name: "bench", Owner: "o", TTL: 10 * time.Second}
			b.ResetTimer()
			for b.Loop() {
				g, err := d.TryAcquire(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := d.Release(ctx, driver.Lease{Name: "bench", Owner: "o", Token: g.Token, Handle: g.Handle}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
