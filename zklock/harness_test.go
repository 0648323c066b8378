package zklock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

type harness struct {
	endpoints []string
	admin     *zk.Conn
	direct    bool // connect without proxies (benchmarks: no Kill)

	mu      sync.Mutex
	proxies map[*Driver][]*proxy
}

// proxiedDriver is a driver reached through the harness's proxies; closing it
// closes them too, so a closed driver leaves no socket behind (the
// conformance suite's leak check counts them).
type proxiedDriver struct {
	*Driver
	h *harness
}

func (d proxiedDriver) Close() error {
	err := d.Driver.Close()
	d.h.mu.Lock()
	ps := d.h.proxies[d.Driver]
	delete(d.h.proxies, d.Driver)
	d.h.mu.Unlock()
	for _, p := range ps {
		p.close()
	}
	return err
}

// unwrap returns the zklock driver behind d.
func unwrap(d driver.Driver) (*Driver, bool) {
	switch d := d.(type) {
	case *Driver:
		return d, true
	case proxiedDriver:
		return d.Driver, true
	}
	return nil, false
}

func newHarness(members int) locktest.NewHarness { return newHarnessWith(members, false) }

func newHarnessWith(members int, direct bool) locktest.NewHarness {
	return func(ctx context.Context, t testing.TB) (locktest.Harness, error) {
		c := shared
		if members > 1 {
			c = testserver.ZooKeeper(t, members)
		}
		admin, err := connect(c.Endpoints(), testSession)
		if err != nil {
			return nil, err
		}
		return &harness{endpoints: c.Endpoints(), admin: admin, direct: direct, proxies: map[*Driver][]*proxy{}}, nil
	}
}

// NewDriver connects through a proxy per server, so that Kill can cut the
// connection the way a crash would.
func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	if h.direct {
		return dialDriver(h.endpoints, nil)
	}
	var ps []*proxy
	var addrs []string
	for _, e := range h.endpoints {
		p, err := newProxy(e)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
		addrs = append(addrs, p.addr())
	}
	d, err := dialDriver(addrs, nil)
	if err != nil {
		for _, p := range ps {
			p.close()
		}
		return nil, err
	}
	h.mu.Lock()
	h.proxies[d] = ps
	h.mu.Unlock()
	return proxiedDriver{Driver: d, h: h}, nil
}

// Kill cuts the driver's connections before closing them, so the session is
// not closed cleanly: the server deletes its nodes only when it expires.
func (h *harness) Kill(d driver.Driver) error {
	zd, ok := unwrap(d)
	if !ok {
		return fmt.Errorf("not a zklock driver: %T", d)
	}
	h.mu.Lock()
	ps, ok := h.proxies[zd]
	delete(h.proxies, zd)
	h.mu.Unlock()
	if !ok {
		return errors.New("driver was not made by this harness with proxies")
	}
	for _, p := range ps {
		p.close()
	}
	zd.Close() // the cut connections cannot end their sessions
	return nil
}

// Drop deletes the holder's node (the first in the queue), as if its session
// had expired; czxids keep increasing, so tokens survive.
func (h *harness) Drop(ctx context.Context, name string) error {
	parent := (&Driver{root: DefaultRoot}).parent(name)
	cs, _, err := h.admin.Children(parent)
	if err != nil {
		return err
	}
	q := queue(cs)
	if len(q) == 0 {
		return errors.New("no holder to drop")
	}
	return h.admin.Delete(parent+"/"+q[0], -1)
}

// DropKind deletes the nodes of the current holders of kind k on name (the
// readers before the first writer, the writer at the head, or the leases up
// to the semaphore's size) and their lock-delay guards, as if their
// sessions had expired and their delays run out.
func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	d := &Driver{root: DefaultRoot}
	path := d.kindPath(k, name)
	dir, guard := path, kindGuard+"r-"
	var holders []string
	if k == driver.Permit {
		dir, guard = path+"/leases", kindGuard
		data, _, err := h.admin.Get(path)
		if err != nil {
			return err
		}
		cs, _, err := h.admin.Children(dir)
		if err != nil {
			return err
		}
		holders = curatorSort(cs, leaseMark)
		if n := len(data); n == 4 {
			holders = holders[:min(len(holders), int(binary.BigEndian.Uint32(data)))]
		}
	} else {
		cs, _, err := h.admin.Children(path)
		if err != nil {
			return err
		}
		var write bool
		holders, write = rwHolders(curatorSort(cs, readMark, writeMark))
		if write != (k == driver.Write) {
			holders = nil
		}
		if write {
			guard = kindGuard + "w-"
		}
	}
	if len(holders) == 0 {
		return fmt.Errorf("no %v holder of %q to drop", k, name)
	}
	for _, n := range holders {
		if err := h.admin.Delete(dir+"/"+n, -1); err != nil {
			return err
		}
		id, _ := protectedID(n)
		if err := h.admin.Delete(path+"/"+guard+id, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
	}
	return nil
}

var _ locktest.KindDropper = (*harness)(nil)

func (h *harness) Config() locktest.Config {
	return locktest.Config{TTL: testSession, SessionBound: true, LockDelay: true}
}

func (h *harness) Close() {
	h.admin.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for d, ps := range h.proxies {
		for _, p := range ps {
			p.close()
		}
		delete(h.proxies, d)
	}
}

// floorConn connects the way NewDriver does, so that floors and drivers pay
// for the same path.
func (h *harness) floorConn() (*zk.Conn, func(), error) {
	if h.direct {
		conn, err := connect(h.endpoints, testSession)
		if err != nil {
			return nil, nil, err
		}
		return conn, conn.Close, nil
	}
	var ps []*proxy
	var addrs []string
	closeAll := func() {
		for _, p := range ps {
			p.close()
		}
	}
	for _, e := range h.endpoints {
		p, err := newProxy(e)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ps = append(ps, p)
		addrs = append(addrs, p.addr())
	}
	conn, err := connect(addrs, testSession)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return conn, func() { conn.Close(); closeAll() }, nil
}

// AcquireReleaseFloor: create an ephemeral sequential node, list the queue,
// delete the node, on a connection of its own.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	conn, closeConn, err := h.floorConn()
	if err != nil {
		return nil, nil, err
	}
	parent := "/dlock-floor"
	if _, err := conn.Create(parent, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		closeConn()
		return nil, nil, err
	}
	op := func(ctx context.Context, key string) error {
		p, err := conn.Create(parent+"/n-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			return err
		}
		if _, _, err := conn.Children(parent); err != nil {
			return err
		}
		return conn.Delete(p, -1)
	}
	return op, closeConn, nil
}

// RoundTripFloor: one raw write (a setData).
func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	conn, closeConn, err := h.floorConn()
	if err != nil {
		return nil, nil, err
	}
	node := "/dlock-floor-rtt"
	if _, err := conn.Create(node, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		closeConn()
		return nil, nil, err
	}
	op := func(ctx context.Context) error {
		_, err := conn.Set(node, []byte("x"), -1)
		return err
	}
	return op, closeConn, nil
}

var _ locktest.Floors = (*harness)(nil)

func TestConformance(t *testing.T) {
	locktest.RunConformanceTests(t, newHarness(1))
}

func TestConformanceEnsemble(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node ensemble: skipped in -short mode")
	}
	locktest.RunConformanceTests(t, newHarness(3))
}

// BenchmarkLocks connects without proxies, like BenchmarkZKLockHotLock.
func BenchmarkLocks(b *testing.B) {
	locktest.RunBenchmarks(b, newHarnessWith(1, true))
}

// BenchmarkZKLockHotLock is the hot-lock hand-off scenario of
// locktest.RunBenchmarks with go-zookeeper's own zk.Lock, for comparison in
// the same run: contenders goroutines over 4 connections hand one lock
// around.
func BenchmarkZKLockHotLock(b *testing.B) {
	h := &harness{endpoints: shared.Endpoints(), direct: true}
	queuetest.NativeHotLock(b, h.RoundTripFloor, func(b *testing.B, n int) (lock, unlock func(g int) error) {
		conns := make([]*zk.Conn, 4)
		for i := range conns {
			conns[i] = newConn(b, shared.Endpoints())
		}
		path := fmt.Sprintf("/dlock-native/hot-%d-%d", n, time.Now().UnixNano())
		locks := make([]*zk.Lock, n)
		for g := range locks {
			locks[g] = zk.NewLock(conns[g%len(conns)], path, zk.WorldACL(zk.PermAll))
		}
		return func(g int) error { return locks[g].Lock() }, func(g int) error { return locks[g].Unlock() }
	})
}

// BenchmarkUncontended compares one uncontended Lock+Unlock through a dlock
// Client (client) or the bare driver (driver) with go-zookeeper's zk.Lock
// and with the raw floor (create an ephemeral sequential node, list the
// queue, delete the node), interleaved in the same run (see
// queuetest.Uncontended).
func BenchmarkUncontended(b *testing.B) {
	h := &harness{endpoints: shared.Endpoints(), direct: true}
	ctx := context.Background()
	floorOp, cleanup, err := h.AcquireReleaseFloor(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	floor := func(ctx context.Context) error { return floorOp(ctx, "") }
	name := fmt.Sprintf("bench-uncontended-%d", time.Now().UnixNano())
	zl := zk.NewLock(newConn(b, shared.Endpoints()), "/dlock-native/"+name, zk.WorldACL(zk.PermAll))
	peer := func(context.Context) error {
		if err := zl.Lock(); err != nil {
			return err
		}
		return zl.Unlock()
	}
	queuetest.UncontendedClientAndDriver(b, name, testSession, func(t testing.TB) queuetest.Driver { return newTestDriver(t, shared.Endpoints(), nil) }, floor, peer)
}
