package zklock

// Connections and TTL classes.
//
// ZooKeeper gives every session one timeout, negotiated when the session is
// made: the server clamps the timeout the client asks for to its
// [minSessionTimeout, maxSessionTimeout] (2 and 20 ticks by default). A lock
// node lives as long as its session, so a lock's TTL is its session's
// negotiated timeout. A driver that opens its own connections (OpenURL, or
// the tests' harness) keeps one connection per TTL class: the first lock
// with a TTL opens a connection asking for exactly that timeout, and if the
// server negotiates another one the TTL is refused with the bounds the server
// showed (both are learned once, then later refusals cost no round trip).
// The timeout a session really has is read from the server's connect
// response on the wire (go-zookeeper does not expose it), so Grant.TTL and
// every validity computation use what the server granted, not what was
// asked.
//
// go-zookeeper does not close the socket on which a server refused to resume
// an expired session; it dials the next server and forgets the old socket,
// which stays open until a garbage collection finds it. The dialer below
// tracks the sockets of each connection, closes the previous one when
// go-zookeeper dials anew (it uses one socket at a time), and closes any left
// when the driver closes.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
)

// tracker is the zk.Dialer of one connection: it records the sockets it
// opened and the session timeouts the server granted on them.
type tracker struct {
	mu       sync.Mutex
	socks    map[*sniffConn]struct{}
	closed   bool
	timeouts map[int64]time.Duration // session ID → negotiated timeout
	tls      *tls.Config             // nil for plaintext (see tls.go)

	creates // the zxids of lock node creates (see sniff.go)
}

func newTracker() *tracker {
	return &tracker{socks: map[*sniffConn]struct{}{}, timeouts: map[int64]time.Duration{}}
}

func (t *tracker) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := dialTLS(network, addr, timeout, t.tls)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, errors.New("zklock: connection closed")
	}
	// go-zookeeper dials only once it is done with its previous socket; it
	// leaves open the one on which its session was refused as expired.
	for s := range t.socks {
		s.Close()
		delete(t.socks, s)
	}
	s := &sniffConn{Conn: c, t: t}
	t.socks[s] = struct{}{}
	return s, nil
}

// timeout returns the negotiated timeout of session id.
func (t *tracker) timeout(id int64) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.timeouts[id]
	return d, ok
}

// close closes every socket still open and refuses later dials.
func (t *tracker) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for s := range t.socks {
		s.Close()
		delete(t.socks, s)
	}
}

// dialer opens the driver's own connections.
type dialer struct {
	servers        []string
	auth           string // digest "user:password", or ""
	connectTimeout time.Duration
	tls            *tls.Config // nil for plaintext (see tls.go)
}

// link is one ZooKeeper connection of the driver and the session it has.
type link struct {
	conn  *zk.Conn
	owns  bool          // the driver closes conn
	track *tracker      // nil for a connection passed to New
	fixed time.Duration // the session timeout of a connection passed to New

	smu  sync.Mutex
	sess *session
}

// sessionTimeout is the negotiated timeout of session id on l.
func (l *link) sessionTimeout(id int64) (time.Duration, error) {
	if l.track == nil {
		return l.fixed, nil
	}
	if d, ok := l.track.timeout(id); ok {
		return d, nil
	}
	return 0, fmt.Errorf("zklock: session %#x: its negotiated timeout is unknown", id)
}

// close closes l's connection when the driver owns it, and any socket it
// left open.
func (l *link) close() {
	if !l.owns {
		return
	}
	l.conn.Close()
	if l.track != nil {
		l.track.close()
	}
}

// msTimeout is ttl in whole milliseconds, rounded up, as ZooKeeper counts
// session timeouts.
func msTimeout(ttl time.Duration) time.Duration {
	return (ttl + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}

// open connects with session timeout ttl and waits for the session. It
// returns the link and the negotiated timeout. done ends the wait early.
func (dl *dialer) open(ctx context.Context, ttl time.Duration) (*link, time.Duration, error) {
	hosts := strings.Join(dl.servers, ",")
	if ttl <= 0 || ttl/time.Millisecond > math.MaxInt32 {
		return nil, 0, fmt.Errorf("zklock: session timeout %v is out of range", ttl)
	}
	t := newTracker()
	t.tls = dl.tls
	conn, events, err := zk.Connect(dl.servers, ttl, zk.WithLogger(nopLogger{}), zk.WithLogInfo(false), zk.WithDialer(t.dial))
	if err != nil {
		return nil, 0, fmt.Errorf("zklock: connect to %s: %w", hosts, err)
	}
	l := &link{conn: conn, owns: true, track: t}
	fail := func(err error) (*link, time.Duration, error) {
		l.close()
		for range events { // until go-zookeeper has stopped
		}
		return nil, 0, err
	}
	timer := time.NewTimer(dl.connectTimeout)
	defer timer.Stop()
wait:
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				break wait
			}
			if ev.State == zk.StateAuthFailed {
				return fail(fmt.Errorf("zklock: connect to %s: authentication failed", hosts))
			}
		case <-timer.C:
			return fail(fmt.Errorf("zklock: connect to %s: no session within %v", hosts, dl.connectTimeout))
		case <-ctx.Done():
			return fail(fmt.Errorf("zklock: connect to %s: %w", hosts, ctx.Err()))
		}
	}
	go func() {
		for range events { // go-zookeeper drops events nobody reads; drain until Close
		}
	}()
	// go-zookeeper v1.0.4 reads its last zxid in sendSetWatches, which it
	// runs just after starting its receive loop (which writes it) on every
	// connect, without a common lock: a watch set before that (the
	// session's watch on "/") made the race detector fire. One round trip
	// without a watch first lets sendSetWatches find no watch and return.
	if _, _, err := conn.Exists("/"); err != nil {
		return fail(fmt.Errorf("zklock: connect to %s: %w", hosts, err))
	}
	if dl.auth != "" {
		if err := conn.AddAuth("digest", []byte(dl.auth)); err != nil {
			l.close()
			return nil, 0, fmt.Errorf("zklock: digest auth: %w", err)
		}
	}
	got, err := l.sessionTimeout(conn.SessionID())
	if err != nil {
		l.close()
		return nil, 0, err
	}
	return l, got, nil
}

// class is the connection serving one TTL; ready closes once l or err is
// set.
type class struct {
	ready chan struct{}
	l     *link
	err   error
}

// bounds are the session timeouts the ensemble grants, as learned; zero
// when not known yet.
type bounds struct{ min, max time.Duration }

// learn records what asking for asked and being granted got shows.
func (b *bounds) learn(asked, got time.Duration) {
	switch {
	case got > asked:
		b.min = got
	case got < asked:
		b.max = got
	}
}

func (b bounds) String() string {
	s := func(d time.Duration) string {
		if d == 0 {
			return "?"
		}
		return d.String()
	}
	return "[" + s(b.min) + ", " + s(b.max) + "]"
}

// refuse returns the error for a TTL outside b.
func refuse(ttl time.Duration, b bounds) error {
	return &dlock.InvalidArgumentError{Arg: "TTL", Reason: fmt.Sprintf(
		"zklock: a lock's TTL is its ZooKeeper session's timeout, and the ensemble grants session timeouts in %v (its minSessionTimeout and maxSessionTimeout); %v is outside", b, ttl)}
}

// linkFor returns the connection serving locks with TTL ttl, opening it
// when it is the first such lock.
func (d *Driver) linkFor(ctx context.Context, ttl time.Duration) (*link, error) {
	ttl = msTimeout(ttl)
	d.cmu.Lock()
	if d.dial == nil {
		d.cmu.Unlock()
		if ttl != d.fixed.fixed {
			return nil, &dlock.InvalidArgumentError{Arg: "TTL", Reason: fmt.Sprintf(
				"zklock: a lock's TTL is its ZooKeeper session's timeout, and this driver's only connection (passed to New) has session timeout %v; %v is another (open the driver from a URL for one session per TTL)", d.fixed.fixed, ttl)}
		}
		return d.fixed, nil
	}
	if ttl/time.Millisecond > math.MaxInt32 {
		d.cmu.Unlock()
		return nil, refuse(ttl, bounds{max: math.MaxInt32 * time.Millisecond})
	}
	if (d.bounds.min > 0 && ttl < d.bounds.min) || (d.bounds.max > 0 && ttl > d.bounds.max) {
		b := d.bounds
		d.cmu.Unlock()
		return nil, refuse(ttl, b)
	}
	c := d.classes[ttl]
	if c == nil {
		c = &class{ready: make(chan struct{})}
		d.classes[ttl] = c
		if !d.bg.Go(func() { d.openClass(ttl, c) }) {
			delete(d.classes, ttl)
			d.cmu.Unlock()
			return nil, errors.New("zklock: driver is closed")
		}
	}
	d.cmu.Unlock()
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("zklock: connect: %w", ctx.Err())
	}
	if c.err != nil {
		return nil, c.err
	}
	return c.l, nil
}

// openClass opens the connection of c, for TTL ttl. An error is not kept:
// the next lock with that TTL tries again, unless the TTL was refused.
func (d *Driver) openClass(ttl time.Duration, c *class) {
	defer close(c.ready)
	ctx, cancel := context.WithTimeout(d.ctx, d.dial.connectTimeout)
	defer cancel()
	l, got, err := d.dial.open(ctx, ttl)
	d.cmu.Lock()
	defer d.cmu.Unlock()
	switch {
	case err != nil:
		c.err = err
		delete(d.classes, ttl)
		return
	case got != ttl:
		l.close()
		d.bounds.learn(ttl, got)
		delete(d.classes, ttl)
		// Learn the other bound too, so the error names both.
		d.cmu.Unlock()
		// A session asked for a very short timeout cannot even connect
		// (go-zookeeper bounds the handshake by it), so probe from 100ms.
		probe := 100 * time.Millisecond
		if got > ttl {
			probe = math.MaxInt32 * time.Millisecond
		}
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		pl, pgot, err := d.dial.open(pctx, probe)
		pcancel()
		if err == nil {
			pl.close()
			d.cmu.Lock()
			d.bounds.learn(probe, pgot)
		} else {
			d.cmu.Lock()
		}
		c.err = refuse(ttl, d.bounds)
		return
	case d.ctx.Err() != nil:
		l.close()
		c.err = errors.New("zklock: driver is closed")
		delete(d.classes, ttl)
		return
	}
	c.l = l
	d.links = append(d.links, l)
}

// anyLink returns a connection for requests that are not bound to a TTL
// (Inspect): the first one opened.
func (d *Driver) anyLink(ctx context.Context) (*link, error) {
	d.cmu.Lock()
	if d.dial == nil {
		d.cmu.Unlock()
		return d.fixed, nil
	}
	if len(d.links) > 0 {
		l := d.links[0]
		d.cmu.Unlock()
		return l, nil
	}
	d.cmu.Unlock()
	return d.linkFor(ctx, d.defaultTTL)
}
