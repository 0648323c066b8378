package etcdlock

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/testserver"
)

// cutProxy forwards TCP connections to one server until cut: then it drops
// every connection and refuses new ones until restore, as a network
// partition between the client and etcd would (a paused server would not
// do: the request waits in its socket buffer and takes effect on resume).
type cutProxy struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        map[net.Conn]struct{}
	wg           sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln {
				p.mu.Unlock()
				c.Close()
				s.Close()
				return
			}
			p.conns[c], p.conns[s] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer p.wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(c, s)
			go pipe(s, c)
		}
	}()
}

// cut drops every connection and stops accepting.
func (p *cutProxy) cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// restore accepts connections again on the same address.
func (p *cutProxy) restore(t *testing.T) {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

// TestUnlockRetriedAfterConnectionCut (audit finding 3, through the dlock
// package): the connection to etcd is cut while Unlock runs, so Unlock fails
// with its outcome unknown; the connection comes back long before the
// lease's TTL. The dlock Client retries the release in the background, so
// another client gets the lock soon after the connection is back, not when
// the holder's lease (which the driver would otherwise keep, or give up only
// after a whole TTL) runs out.
func TestUnlockRetriedAfterConnectionCut(t *testing.T) {
	const ttl = 10 * time.Second
	c := testserver.Etcd(t, 1)
	proxy := newCutProxy(t, c.Endpoints()[0])
	defer proxy.cut()
	open := func(endpoint string) *dlock.Client {
		cli, err := dial([]string{endpoint})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		d, err := newDriver(cli, true, nil)
		if err != nil {
			cli.Close()
			t.Fatalf("driver: %v", err)
		}
		return dlock.New(d, &dlock.Options{TTL: ttl, ReleaseTimeout: 300 * time.Millisecond, WaitMax: 100 * time.Millisecond})
	}
	a, b := open(proxy.addr), open(c.Endpoints()[0])
	defer a.Close()
	defer b.Close()

	const name = "unlock-retry/cut"
	la, err := a.NewMutex(name, nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	proxy.cut()
	uerr := la.Unlock(context.Background())
	proxy.restore(t)
	if uerr == nil {
		t.Fatal("Unlock succeeded with the connection cut: the test did not set up what it means to")
	}
	restored := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*ttl)
	defer cancel()
	lb, err := b.NewMutex(name, nil).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock after the failed Unlock: %v", err)
	}
	took := time.Since(restored)
	defer lb.Unlock(context.Background())
	if took > ttl*6/10 {
		t.Fatalf("the lock given up by a failed Unlock was granted to another client %v after the connection came back (TTL %v): the release was not retried", took, ttl)
	}
	t.Logf("lock handed on %v after the connection came back", took.Round(time.Millisecond))
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d <= %d", lb.Token(), la.Token())
	}
	if err := lb.Err(); err != nil && !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("new holder's lease: %v", err)
	}
}
