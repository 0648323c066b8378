package sqlitelock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Waking waiters. SQLite has no notification, and every user of a database
// file is on the same machine, so a release is signalled with a file lock
// on a companion file next to the database (<database>-dlock): a driver
// that holds a lock keeps an exclusive lock on one byte of that file (at an
// offset hashed from the lock's name) until it releases; a waiter blocks
// for a shared lock on the same byte, which the kernel grants the moment
// the holder lets go (or its process dies), and wakes its Lock. The grant
// itself is still the table's one atomic statement: a wake only says "try
// now", so a missed or spurious one costs latency, never safety. A holder
// that has no file lock (it crashed, or is an older driver) gives no wake;
// a waiter then polls on a backoff, and at the lease's expiry, as before.
//
// The byte locks are Linux open-file-description locks (F_OFD_SETLK): they
// belong to one open of the file, so two drivers in one process (or a
// holder and a waiter in one driver) exclude each other like two processes.

// signal is the companion file of one driver; nil (no signals) when the
// database has no file or the companion cannot be opened.
type signal struct {
	path string // the companion file

	mu      sync.Mutex
	hold    fileLocker        // this driver's exclusive byte locks; nil if unavailable
	held    map[string]string // name (or kindKey) → owner, of this driver's grants
	offsets map[int64]int     // held names per offset (names may collide)
	watches *sqlcommon.Watches
	closed  bool
	// yield holds, per name this driver just released while another
	// driver's waiters watched it, until when this driver's own new
	// attempts on it stand back (see yielding).
	yield map[string]time.Time
	// mark keeps a shared lock on waitersOff of every name this driver has
	// subscribers for (marks counts them per byte); opened on first use.
	mark  fileLocker
	marks map[int64]int
}

// yieldFor is how long a driver that released a lock with waiters elsewhere
// leaves it to them: a woken waiter needs well under a millisecond to make
// its grant statement; the releaser looping straight back into Lock (a hot
// lock) needs microseconds, and without this took the lock again about 83%
// of the time under 8 contenders.
const yieldFor = 5 * time.Millisecond

// waitersOff is the byte whose shared lock a watch keeps for as long as it
// watches the name at off: a releaser that finds it held knows waiters
// elsewhere are being woken. Names' bytes are below 1<<62.
func waitersOff(off int64) int64 { return off + 1<<62 }

// fileLocker is one open file description of the companion file.
type fileLocker interface {
	// try takes (exclusive or shared) or, with unlock, drops the lock on
	// byte off without waiting; false when another description holds a
	// conflicting lock.
	try(off int64, exclusive, unlock bool) (bool, error)
	// others reports, without taking anything, whether another open file
	// description holds a lock on byte off.
	others(off int64) (bool, error)
	// wait blocks until a shared lock on off is granted.
	wait(off int64) error
	close() error
}

// newSignal opens the companion file of the database file dbFile (empty for
// a database with no file: no signals). A companion that cannot be opened
// for writing leaves this driver's grants without signals; one that cannot
// be opened at all leaves it without any.
func newSignal(dbFile string) *signal {
	if dbFile == "" {
		return nil
	}
	perm := os.FileMode(0o644)
	if fi, err := os.Stat(dbFile); err == nil {
		perm = fi.Mode().Perm()
	}
	s := &signal{path: dbFile + "-dlock", held: map[string]string{}, offsets: map[int64]int{}, yield: map[string]time.Time{}, marks: map[int64]int{}}
	s.watches = sqlcommon.NewWatches(func(_ context.Context, name string) (sqlcommon.Waiter, error) {
		f, err := openLocker(s.path, false, 0)
		if err != nil {
			return nil, err
		}
		return waiter{f, offset(name)}, nil
	}, nil)
	if f, err := openLocker(s.path, true, perm); err == nil {
		s.hold = f
	} else if f, err := openLocker(s.path, false, 0); err == nil {
		_ = f.close()
	} else {
		return nil
	}
	return s
}

// offset maps a lock name to its byte in the companion file.
func offset(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64() & (1<<62 - 1))
}

// grant marks name as held by owner through this driver (a new grant) and
// takes its byte.
func (s *signal) grant(name, owner string) { s.grantKey(name, name, owner) }

// grantKey is grant for a holder listed under key: a mutex under its name,
// a reader, writer or permit under kindKey. Every holder of name in this
// driver keeps name's byte until the last of them lets go.
// A byte another description holds for an instant (a waiter being woken)
// is retried briefly; if it stays busy (another name on the same byte, held
// elsewhere) the grant simply gives no wake-up signal.
func (s *signal) grantKey(key, name, owner string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.hold == nil {
		return
	}
	if _, ok := s.held[key]; ok {
		s.held[key] = owner // a grant that lapsed here unreleased
		return
	}
	s.held[key] = owner
	off := offset(name)
	s.offsets[off]++
	if s.offsets[off] > 1 {
		return
	}
	for i := 0; i < 50; i++ {
		ok, err := s.hold.try(off, true, false)
		if ok || err != nil {
			return
		}
		t := time.NewTimer(20 * time.Microsecond)
		<-t.C
	}
}

// released drops name's byte once owner no longer holds name (released,
// or found expired).
func (s *signal) released(name, owner string) { s.releasedKey(name, name, owner) }

// releasedKey is released for a holder listed under key (see grantKey).
func (s *signal) releasedKey(key, name, owner string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.held[key]; s.closed || !ok || o != owner {
		return
	}
	delete(s.held, key)
	off := offset(name)
	if s.offsets[off]--; s.offsets[off] > 0 {
		return
	}
	delete(s.offsets, off)
	_, _ = s.hold.try(off, false, true)
	// Waiters elsewhere (another driver's mark; with subscribers of its
	// own this driver cannot tell, and leaves it to them to race as before).
	if s.marks[off] == 0 {
		if w, err := s.hold.others(waitersOff(off)); err == nil && w {
			if len(s.yield) >= 256 {
				for n, u := range s.yield {
					if time.Until(u) <= 0 {
						delete(s.yield, n)
					}
				}
			}
			s.yield[name] = time.Now().Add(yieldFor)
		}
	}
}

// marked records a subscriber of name in this driver: while a name has
// any, this driver keeps a shared lock on its waitersOff byte, which
// tells a releaser in another driver that waiters are being woken. It
// returns the function that drops the record.
func (s *signal) marked(name string) func() {
	off := waitersOff(offset(name))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return func() {}
	}
	if s.mark == nil {
		f, err := openLocker(s.path, false, 0)
		if err != nil {
			return func() {}
		}
		s.mark = f
	}
	if s.marks[off]++; s.marks[off] == 1 {
		// Nobody takes that byte exclusively: the shared lock is granted.
		_, _ = s.mark.try(off, false, false)
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed || s.marks[off] == 0 {
			return
		}
		if s.marks[off]--; s.marks[off] == 0 {
			delete(s.marks, off)
			_, _ = s.mark.try(off, false, true)
		}
	}
}

// markedSub is a subscription that keeps its name marked (see marked)
// until it is closed.
type markedSub struct {
	driver.Subscription
	once   sync.Once
	unmark func()
}

func (m *markedSub) Close() error {
	m.once.Do(m.unmark)
	return m.Subscription.Close()
}

// yielding reports how long this driver's new attempts on name stand back:
// for up to yieldFor after it released name while waiters elsewhere (in
// another driver or process) watched it, so that the waiter woken by the
// release takes the lock rather than this driver looping back into Lock.
// Such an attempt is refused as if the lock were held, with that time as
// its RetryAfter, without asking the database. The stand-back ends early
// once nobody watches the name any more (this driver has no subscribers of
// its own for it and no other driver marks it), so a TryLock after the
// waiters are gone is answered by the table as before.
func (s *signal) yielding(name string) time.Duration {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.yield[name]
	if !ok {
		return 0
	}
	left := time.Until(until)
	if off := waitersOff(offset(name)); left > 0 && !s.closed && s.marks[off] == 0 {
		if w, err := s.hold.others(off); err != nil || !w {
			left = 0
		}
	}
	if left <= 0 {
		delete(s.yield, name)
		return 0
	}
	return left
}

// close drops every byte this driver holds (which wakes their waiters)
// and stops the watches; a watch blocked in the kernel ends when its byte
// is next free.
func (s *signal) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if s.hold != nil {
		_ = s.hold.close()
	}
	if s.mark != nil {
		_ = s.mark.close()
	}
	s.watches.Close(false)
}

// Subscribe implements driver.Notifier: the subscription is woken when the
// holder of name releases it (or its process ends), when the lock looks
// free with no holder signalling (on a backoff from 2ms to 1s), and never
// otherwise. Within one driver the longest-waiting subscriber of a name is
// woken first. Without a companion file (a database with no file, a
// directory that cannot be written) it returns an error, and Lock polls.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	if d.sig == nil {
		return nil, errors.New("sqlitelock: no companion file for wake-ups (the database has no file)")
	}
	sub, err := d.sig.watches.Subscribe(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("sqlitelock: subscribe: %w", err)
	}
	return &markedSub{Subscription: sub, unmark: d.sig.marked(name)}, nil
}

// waiter waits for one name's byte on its own open of the companion file.
type waiter struct {
	f   fileLocker
	off int64
}

// Wait implements sqlcommon.Waiter. The kernel's wait cannot be
// interrupted: it ends when the byte is next free (a driver's Close frees
// its own bytes; a process's end frees its).
func (w waiter) Wait(context.Context) (sqlcommon.Outcome, error) {
	ok, err := w.f.try(w.off, false, false)
	if err != nil {
		return 0, err
	}
	o := sqlcommon.NoHolder
	if !ok {
		if err := w.f.wait(w.off); err != nil {
			return 0, err
		}
		o = sqlcommon.Released
	}
	_, _ = w.f.try(w.off, false, true)
	return o, nil
}

// Close implements sqlcommon.Waiter.
func (w waiter) Close() { _ = w.f.close() }
