package redislock

import (
	"context"
	"net/url"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/testserver"
)

// TestURLClientsSmallBuffers: the clients OpenURL and OpenSentinelURL make
// read and write through 4 KiB buffers, not go-redis's 32 KiB ones (a pool
// grown to 20 connections kept 1.3 MB of buffers).
func TestURLClientsSmallBuffers(t *testing.T) {
	d := openURLDriver(t, testserver.Redis(t, nil).URL())
	c, ok := d.client.(*redis.Client)
	if !ok {
		t.Fatalf("client %T", d.client)
	}
	if o := c.Options(); o.ReadBufferSize != connBuffer || o.WriteBufferSize != connBuffer {
		t.Errorf("redis://: buffers %d/%d B, want %d", o.ReadBufferSize, o.WriteBufferSize, connBuffer)
	}
	su, err := url.Parse("redis-sentinel://127.0.0.1:1/0?master_name=m")
	if err != nil {
		t.Fatal(err)
	}
	fo, _, err := parseSentinelURL(su)
	if err != nil {
		t.Fatal(err)
	}
	if fo.ReadBufferSize != connBuffer || fo.WriteBufferSize != connBuffer {
		t.Errorf("redis-sentinel://: buffers %d/%d B, want %d", fo.ReadBufferSize, fo.WriteBufferSize, connBuffer)
	}
}

// openURLDriver opens a driver from rawURL (redis:// or rediss://), closed
// at the end of tb.
func openURLDriver(tb testing.TB, rawURL string) *Driver {
	tb.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	dd, err := OpenURL(context.Background(), u)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = dd.Close() })
	return dd.(*Driver)
}
