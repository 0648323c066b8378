// Package proxy is the checker's fault-injecting TCP proxy: it sits between
// one worker process and one server address, and can cut the traffic
// (a partition) or delay it (latency).
package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections accepted on a loopback port to one upstream
// address. Its methods are safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	delay  time.Duration
	cut    bool
	healed chan struct{} // closed when a partition heals
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on 127.0.0.1 (a free port) and forwards to upstream
// ("host:port").
func Start(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}, healed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients dial instead of the upstream's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay delays every chunk of data, each way, by d (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Partition stops all traffic: open connections stay open but carry no more
// bytes either way, and new connections are accepted but never reach the
// upstream, as when packets are dropped.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		p.cut = true
		p.healed = make(chan struct{})
	}
}

// Heal ends a partition. Every connection that lived through it is closed
// (its peers see a reset, as after a long outage, and reconnect).
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return
	}
	p.cut = false
	for c := range p.conns {
		c.Close()
	}
	close(p.healed)
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	if p.cut {
		p.cut = false
		close(p.healed)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// track adds c to the connections Heal and Close end; false if closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// gate returns nil when traffic may flow, else a channel closed when the
// partition heals.
func (p *Proxy) gate() (time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return 0, p.healed
	}
	return p.delay, nil
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	if _, healed := p.gate(); healed != nil {
		<-healed // a connection made during a partition goes nowhere
		return
	}
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	go func() { p.pump(up, c); done <- struct{}{} }()
	go func() { p.pump(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
}

// pump copies src to dst, holding each chunk for the current delay and
// holding everything while partitioned.
func (p *Proxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		read := time.Now()
		if n > 0 {
			delay, healed := p.gate()
			if healed != nil {
				<-healed
				return // Heal closed both connections
			}
			if wait := time.Until(read.Add(delay)); wait > 0 {
				time.Sleep(wait) // this sleep is the injected latency
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}
