package redislock

import (
	"net/url"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/testserver"
)

// TestURLClientsSmallBuffers: the clients OpenURL and OpenSentinelURL make
// read and write through 4 KiB buffers, not go-redis's 32 KiB ones (a pool
// grown to 20 connections kept 1.3 MB of buffers).
func TestURLClientsSmallBuffers(t *testing.T) {
	srv := testserver.Redis(t, nil)
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	dd, err := OpenURL(ctxT(t), u)
	if err != nil {
		t.Fatal(err)
	}
	defer dd.Close()
	c, ok := dd.(*Driver).client.(*redis.Client)
	if !ok {
		t.Fatalf("client %T", dd.(*Driver).client)
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
