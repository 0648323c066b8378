package redlock

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redislane"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
)

// TestHandleIsSmall: a held mutex lease keeps a handle of three words
// whose keys are one compact Ref (the one the driver's book of grants
// keeps too), not five strings of its own and a copy in the book: 24 B
// against 96 B (and 80 B more for the book's copy) before.
func TestHandleIsSmall(t *testing.T) {
	if s := unsafe.Sizeof(handle{}); s > 24 {
		t.Fatalf("a handle is %d B, want at most 24 (three words)", s)
	}
	srvs := testserver.RedisN(t, 3, nil)
	ctx := context.Background()
	d, err := openTest(ctx, redlockURL(srvs, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	req := driver.AcquireRequest{Name: "handle-small", Owner: "owner", TTL: 30 * time.Second}
	g, err := d.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	h, ok := g.Handle.(*handle)
	if !ok || h == nil {
		t.Fatalf("handle %T", g.Handle)
	}
	if want := redisscript.KeysFor(DefaultKeyPrefix, req.Name); h.ref == nil || h.ref.Keys() != want {
		t.Fatalf("handle's keys: got %+v, want %+v", h.ref, want)
	}
	// The lease's operations use the handle's keys.
	l := driver.Lease{Name: req.Name, Owner: req.Owner, TTL: req.TTL, Token: g.Token, Handle: g.Handle}
	if ops := d.opsForLease(l); ops.ref != h.ref {
		t.Fatal("the lease's operations do not use the handle's keys")
	}
	if _, err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestURLClientsSmallBuffers: the clients OpenURL makes read and write
// through 4 KiB buffers, not go-redis's 32 KiB ones: a pool grown to 20
// connections per node kept 3.8 MB on 3 nodes (≈ 390 B per lease at
// 10,000 held leases in BenchmarkHeapPerLease).
func TestURLClientsSmallBuffers(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	d, err := openTest(context.Background(), redlockURL(srvs, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for i, n := range d.nodes {
		raw := n.client
		if w, ok := raw.(*redislane.Client); ok {
			raw = w.Unwrap()
		}
		c, ok := raw.(*redis.Client)
		if !ok {
			t.Fatalf("node %d: client %T", i, raw)
		}
		if o := c.Options(); o.ReadBufferSize != connBuffer || o.WriteBufferSize != connBuffer {
			t.Errorf("node %d: buffers %d/%d B, want %d", i, o.ReadBufferSize, o.WriteBufferSize, connBuffer)
		}
	}
}
