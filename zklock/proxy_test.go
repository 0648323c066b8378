package zklock

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"
)

// proxy forwards TCP connections to one server. Cut closes the listener and
// every connection at once: to the server it looks like a crashed client,
// whose session then expires by timeout.
//
// On a client's reconnection to a session it had (the connect request
// carries a session id), the proxy holds the server's replies after the
// handshake back until the client has sent its setWatches request, or for
// at most watchGate. go-zookeeper (v1.0.4) reads the zxid it puts in that
// request while its receive loop, already started, may be writing it for a
// reply: a data race inside the library that -race reports in whichever
// test reconnects a client with a watch set and a request queued (about
// one reconnection in a hundred under load). Once the replies wait for
// setWatches, the read comes before the write: the client's write of
// setWatches and the proxy's reads and writes of the socket order them, as
// the race detector counts every socket write before a later read.
// TestProxyOrdersSetWatches reproduces the race without the gate.
type proxy struct {
	ln     net.Listener
	target string
	done   chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	cut   bool
	wg    sync.WaitGroup
}

// watchGate bounds how long a reconnected client's replies wait for its
// setWatches request: a client with no watch set sends none. It stays well
// below the receive timeout of the shortest session the test server allows
// (2 ticks of 200ms, so 267ms), and far above the microseconds the client
// takes from starting its receive loop to reading the zxid.
const watchGate = 100 * time.Millisecond

// ZooKeeper opcodes of the requests that re-set a client's watches.
const (
	opSetWatches  = 101
	opSetWatches2 = 105
)

func newProxy(target string) (*proxy, error) { return newProxyAt("127.0.0.1:0", target) }

// newProxyAt listens on addr (e.g. the address of a proxy closed before).
func newProxyAt(addr, target string) (*proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, s) {
			return
		}
		gate := make(chan struct{})
		p.wg.Add(2)
		go p.fromClient(s, c, gate)
		go p.toClient(c, s, gate)
	}
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// readFrame reads one length-prefixed ZooKeeper packet, prefix included.
func readFrame(r *bufio.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	f := make([]byte, 4+int(binary.BigEndian.Uint32(n[:])))
	copy(f, n[:])
	_, err := io.ReadFull(r, f[4:])
	return f, err
}

// fromClient forwards the client's packets to the server and opens gate
// once the replies need not wait: at once for a new session, else when the
// client's setWatches request has gone by.
func (p *proxy) fromClient(dst, src net.Conn, gate chan struct{}) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	open := sync.OnceFunc(func() { close(gate) })
	defer open()
	r := bufio.NewReader(src)
	// The connect request: protocol version (4 bytes), last zxid seen (8),
	// timeout (4), session id (8), password.
	f, err := readFrame(r)
	if err != nil {
		return
	}
	if len(f) < 28 || binary.BigEndian.Uint64(f[20:28]) == 0 {
		open()
	}
	if _, err := dst.Write(f); err != nil {
		return
	}
	for {
		select {
		case <-gate:
			io.Copy(dst, r)
			return
		default:
		}
		f, err := readFrame(r)
		if err != nil {
			return
		}
		// A request: xid (4 bytes), opcode (4), body.
		if len(f) >= 12 {
			if op := int32(binary.BigEndian.Uint32(f[8:12])); op == opSetWatches || op == opSetWatches2 {
				open()
			}
		}
		if _, err := dst.Write(f); err != nil {
			return
		}
	}
}

// toClient forwards the server's connect reply, then the rest once gate
// opens (or watchGate passes).
func (p *proxy) toClient(dst, src net.Conn, gate chan struct{}) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	r := bufio.NewReader(src)
	f, err := readFrame(r)
	if err != nil {
		return
	}
	if _, err := dst.Write(f); err != nil {
		return
	}
	t := time.NewTimer(watchGate)
	select {
	case <-gate:
	case <-t.C:
	case <-p.done:
		return
	}
	t.Stop()
	io.Copy(dst, r)
}

// close cuts every connection and stops accepting new ones.
func (p *proxy) close() {
	p.mu.Lock()
	if !p.cut {
		close(p.done)
	}
	p.cut = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// cutConns closes the proxy's connections but keeps listening, so that the
// client reconnects (to this proxy or another of its servers).
func (p *proxy) cutConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}
