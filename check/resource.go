package check

import (
	"bufio"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/fence"
)

// resource is the fenced resource embedded in the coordinator: per lock
// name it accepts a write whose token is at least the highest it has
// accepted (package fence), and logs every attempt as a KindWrite event.
// Workers reach it on loopback directly, never through the fault proxy.
type resource struct {
	ln     net.Listener
	fence  fence.Checker
	record func(Event)

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// order serialises stamp, fence check and record, so the history's
	// order of writes is the order the fence saw them in.
	order sync.Mutex
	wg    sync.WaitGroup
}

func startResource(record func(Event)) (*resource, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &resource{ln: ln, record: record, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *resource) addr() string { return r.ln.Addr().String() }

func (r *resource) accept() {
	defer r.wg.Done()
	for {
		conn, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.conns == nil {
			r.mu.Unlock()
			conn.Close()
			return
		}
		r.conns[conn] = struct{}{}
		r.mu.Unlock()
		r.wg.Add(1)
		go r.serve(conn)
	}
}

// serve reads "worker N" and then one write per line:
// lock TAB token TAB goroutine TAB op TAB validUntil; it answers 1 (accepted)
// or 0 (refused as stale).
func (r *resource) serve(conn net.Conn) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.conns, conn)
		r.mu.Unlock()
		conn.Close()
	}()
	br := bufio.NewReader(conn)
	hello, err := br.ReadString('\n')
	if err != nil {
		return
	}
	worker, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(hello), "worker "))
	if err != nil {
		return
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		ev, err := parseWrite(strings.TrimSuffix(line, "\n"))
		if err != nil {
			return
		}
		ev.Worker = worker
		r.order.Lock()
		ev.Mono, ev.Wall = mono(), time.Now()
		ev.Accepted = r.fence.Check(ev.Lock, ev.Token) == nil
		r.record(ev)
		r.order.Unlock()
		answer := "0\n"
		if ev.Accepted {
			answer = "1\n"
		}
		if _, err := conn.Write([]byte(answer)); err != nil {
			return
		}
	}
}

func parseWrite(line string) (Event, error) {
	f := strings.Split(line, "\t")
	if len(f) != 5 {
		return Event{}, errors.New("bad write line")
	}
	token, err1 := strconv.ParseUint(f[1], 10, 64)
	g, err2 := strconv.Atoi(f[2])
	op, err3 := strconv.ParseInt(f[3], 10, 64)
	vu, err4 := strconv.ParseInt(f[4], 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Event{}, err
	}
	ev := stamp(KindWrite)
	ev.Lock, ev.Token, ev.Goroutine, ev.Op, ev.ValidUntil = f[0], token, g, op, vu
	return ev, nil
}

// close stops the listener and every connection, and waits for the
// goroutines.
func (r *resource) close() {
	r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}
