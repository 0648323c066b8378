package redisscript

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/redis/go-redis/v9"
)

func TestGrantsBook(t *testing.T) {
	var g Grants
	k := KeysFor(DefaultPrefix, "a")
	now := time.Now()
	g.Granted(k, "o", time.Minute, now)
	g.Granted(k, "o", time.Minute, now) // re-entered
	g.Granted(KeysFor(DefaultPrefix, "b"), "o", time.Minute, now)
	g.Released(k.Lock, "o", true)
	g.Renewed(KeysFor(DefaultPrefix, "b").Lock, "o", time.Minute, now, false) // gone
	hs := g.Take()
	if len(hs) != 1 || hs[0].Keys != k || hs[0].Owner != "o" || hs[0].Holds != 1 {
		t.Fatalf("Take = %+v; want one hold of a by o", hs)
	}
	if hs := g.Take(); len(hs) != 0 {
		t.Fatalf("second Take = %+v; want nothing", hs)
	}
	// A release the server refused drops the entry whatever its holds.
	g.Granted(k, "o", time.Minute, now)
	g.Granted(k, "o", time.Minute, now)
	g.Released(k.Lock, "o", false)
	if hs := g.Take(); len(hs) != 0 {
		t.Fatalf("Take after a refused release = %+v; want nothing", hs)
	}
	// Leases long past their TTL are neither taken nor kept.
	old := now.Add(-time.Hour)
	for i := range 2 * minPrune {
		g.Granted(KeysFor(DefaultPrefix, string(rune('a'+i%26))+time.Duration(i).String()), "o", time.Second, old)
	}
	g.mu.Lock()
	n := len(g.m)
	g.mu.Unlock()
	if n > minPrune+1 {
		t.Fatalf("book holds %d stale entries; want them pruned", n)
	}
	if hs := g.Take(); len(hs) != 0 {
		t.Fatalf("Take of stale leases = %d entries; want none", len(hs))
	}
}

func TestGateStopWaits(t *testing.T) {
	var g Gate
	if !g.Enter() {
		t.Fatal("open gate refused a call")
	}
	g.Add(1)
	stopped := make(chan struct{})
	go func() { g.Stop(); close(stopped) }()
	// Stop refuses new calls at once, while the admitted one runs on.
	deadline := time.Now().Add(5 * time.Second)
	for g.Enter() {
		g.Exit()
		if time.Now().After(deadline) {
			t.Fatal("Stop did not close the gate")
		}
		runtime.Gosched()
	}
	if !g.Stopped() {
		t.Fatal("Stopped is false after a refusal")
	}
	var once sync.Once
	finish := func() { once.Do(func() { g.Exit(); g.Done() }) }
	defer finish()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a call was admitted")
	default:
	}
	finish()
	<-stopped
}

func TestParseValueStrict(t *testing.T) {
	for _, v := range []string{"1\n2\n\n\no", "3\n4\n100\n5\nowner\nwith\nnewlines"} {
		if _, _, _, ok := ParseValue(v); !ok {
			t.Errorf("ParseValue(%q) refused a dlock value", v)
		}
	}
	for _, v := range []string{"v", "", "+1\n2\n\n\no", "1\n-2\n\n\no", "1\n2\nx\n\no", "1\n2\n\n1.5\no", "\n2\n\n\no"} {
		if _, _, _, ok := ParseValue(v); ok {
			t.Errorf("ParseValue(%q) accepted a value dlock did not write", v)
		}
	}
}

// TestReleaseAll: Close's release of the book reaches every node it can,
// and a node it cannot reach is named in the error.
func TestReleaseAll(t *testing.T) {
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	live := redis.NewClient(opt)
	defer live.Close()
	dead := redis.NewClient(opt)
	_ = dead.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var g Grants
	if err := g.ReleaseAll([]redis.UniversalClient{live, dead}); err != nil {
		t.Fatalf("ReleaseAll of an empty book: %v", err)
	}
	k := KeysFor(DefaultPrefix, "release-all")
	sent := time.Now()
	if r, err := Acquire(ctx, live, k, "o", time.Minute, 0); err != nil || !r.Granted {
		t.Fatalf("Acquire: %+v, %v", r, err)
	}
	g.Granted(k, "o", time.Minute, sent)
	err = g.ReleaseAll([]redis.UniversalClient{live, dead})
	if err == nil || !strings.Contains(err.Error(), "1 lock(s)") || !strings.Contains(err.Error(), "node 1") {
		t.Fatalf("ReleaseAll with node 1 closed: %v; want an error naming 1 lock and node 1", err)
	}
	if n, err := live.Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
		t.Fatalf("lock key still on the live node after ReleaseAll: exists=%d, %v", n, err)
	}
	if hs := g.Take(); len(hs) != 0 {
		t.Fatalf("book after ReleaseAll = %+v; want empty", hs)
	}
}

// TestGrantsBookRef: a grant booked by its Ref (redislock's handle) comes
// back from Take with its keys, hold count and TTL, and booking another
// hold of an entry that exists allocates nothing.
func TestGrantsBookRef(t *testing.T) {
	var g Grants
	r, err := PlainRefFor("orders:42")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	g.GrantedRef(&r, "o", 1500*time.Millisecond, now)
	g.GrantedKind(KindKeysFor(DefaultPrefix, "a", driver.Permit), "o", time.Minute, now)
	if n := testing.AllocsPerRun(100, func() { g.GrantedRef(&r, "o", 1500*time.Millisecond, now) }); n != 0 {
		t.Errorf("re-booking a held entry: %v allocations, want 0", n)
	}
	for range 101 { // AllocsPerRun ran it 101 times
		g.Released(r.Lock(), "o", true)
	}
	hs := g.Take()
	if len(hs) != 2 {
		t.Fatalf("Take = %+v; want two grants", hs)
	}
	for _, h := range hs {
		switch {
		case h.Kind.Kind == driver.Permit:
			if h.Kind != KindKeysFor(DefaultPrefix, "a", driver.Permit) || h.Holds != 1 || h.TTL != time.Minute {
				t.Errorf("permit grant = %+v", h)
			}
		case h.Keys != r.Keys() || h.Owner != "o" || h.Holds != 1 || h.TTL != 1500*time.Millisecond:
			t.Errorf("mutex grant = %+v; want one hold of %+v, TTL 1.5s", h, r.Keys())
		}
	}
}
