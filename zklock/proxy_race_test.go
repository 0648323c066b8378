package zklock

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestProxyOrdersSetWatches reconnects a go-zookeeper client with a watch
// set and requests always queued, through two proxies to the shared server
// (so that a reconnection goes to the other at once, without go-zookeeper's
// one-second pause after trying every server). Without the proxies' gate
// (see proxy) the race detector reports go-zookeeper's race on lastZxid
// within a few hundred reconnections (at the 96th in the run that found
// it); with it, none.
func TestProxyOrdersSetWatches(t *testing.T) {
	var ps []*proxy
	var addrs []string
	for range 2 {
		p, err := newProxy(shared.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		defer p.close()
		ps = append(ps, p)
		addrs = append(addrs, p.addr())
	}
	conn, err := connect(addrs, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, _, _, err := conn.ExistsW("/"); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop.Store(true)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				conn.Exists("/")
			}
		}()
	}
	for i := range 400 {
		for _, p := range ps {
			p.cutConns()
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, _, err := conn.Exists("/"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("reconnection %d: no answer within 10s", i)
			}
		}
	}
}
