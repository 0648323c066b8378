package sqlitelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Waking waiters. SQLite has no notification, and every user of a database
// file is on the same machine, so a release is signalled with a file lock
// on a companion file next to the database: a driver that holds a lock
// keeps an exclusive lock on one byte of one of the files of the companion
// directory <database>-dlock.d (the file and the offset hashed from the
// lock's name) until it releases; a waiter blocks for a shared lock on the
// same byte, which the kernel grants the moment the holder lets go (or its
// process dies), and wakes its Lock. The grant itself is still the table's
// one atomic statement: a wake only says "try now", so a missed or spurious
// one costs latency, never safety. A holder that has no file lock (it
// crashed, or is an older driver) gives no wake; a waiter then polls on a
// backoff, and at the lease's expiry, as before.
//
// The byte locks are Linux open-file-description locks (F_OFD_SETLK): they
// belong to one open of the file, so two drivers in one process (or a
// holder and a waiter in one driver) exclude each other like two processes.
//
// The bytes are spread over several shard files because Linux keeps one list of a
// file's record locks and walks all of it on every fcntl: with 10,000 held
// locks on one file, the grant and release of another name cost 325 µs
// instead of 1.7 µs. Versions before the shards kept every byte on the one
// file <database>-dlock; they and this one do not see each other's signals
// (their waiters poll each other's holders), which costs wake-up latency,
// never safety.

// shards is the number of files in the companion directory. A driver opens
// each on first use, so it keeps at most shards descriptors for its own
// byte locks (and one more per name it waits for), and 10,000 held locks
// put some 160 on each file.
const shards = 64

// signal is the companion directory of one driver; nil (no signals) when
// the database has no file or the directory cannot be made or found.
type signal struct {
	dir  string      // the companion directory
	perm os.FileMode // the database file's permission bits, for the shards

	mu sync.Mutex
	// files are this driver's own opens of the shards, made on first use:
	// its exclusive byte locks of held names and shared ones of waitersOff
	// (see marked) both live on them.
	files   [shards]shardFile
	held    map[string]string // name (or kindKey) → owner, of this driver's grants
	offsets map[int64]int     // held names per offset (names may collide)
	watches *sqlcommon.Watches
	closed  bool
	// yield holds, per name this driver just released while another
	// driver's waiters watched it, until when this driver's own new
	// attempts on it stand back (see yielding).
	yield map[string]time.Time
	// marks counts, per waitersOff byte, the names this driver has
	// subscribers for; while it is above 0 the driver keeps a shared lock
	// on that byte (see marked).
	marks map[int64]int
}

// shardFile is a driver's open of one shard.
type shardFile struct {
	f        fileLocker // nil until opened
	readOnly bool       // f could be opened for reading only: no holds
	failed   bool       // could not be opened at all; not retried
}

// yieldFor is how long a driver that released a lock with waiters elsewhere
// leaves it to them: a woken waiter needs well under a millisecond to make
// its grant statement; the releaser looping straight back into Lock (a hot
// lock) needs microseconds, and without this took the lock again about 83%
// of the time under 8 contenders.
const yieldFor = 5 * time.Millisecond

// waitersOff is the byte whose shared lock a watch keeps for as long as it
// watches the name at off: a releaser that finds it held knows waiters
// elsewhere are being woken. Names' bytes are below 1<<62; waitersOff(off)
// is in the same shard as off.
func waitersOff(off int64) int64 { return off + 1<<62 }

// shardOf is the shard of the companion directory that holds byte off (of
// a name, or its waitersOff).
func shardOf(off int64) int { return int(off % shards) }

// fileLocker is one open file description of a shard file.
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

// newSignal makes (or finds) the companion directory of the database file
// dbFile (empty for a database with no file: no signals). A directory that
// cannot be made or found leaves the driver without signals; a shard that
// cannot be opened for writing leaves this driver's grants of its names
// without signals, and one that cannot be opened at all its waiters, too.
func newSignal(dbFile string) *signal {
	if dbFile == "" || !lockable {
		return nil
	}
	perm := os.FileMode(0o644)
	if fi, err := os.Stat(dbFile); err == nil {
		perm = fi.Mode().Perm()
	}
	dir := dbFile + "-dlock.d"
	// Searchable wherever the database is readable: 0644 → 0755.
	_ = os.Mkdir(dir, perm|(perm&0o444)>>2)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil
	}
	s := &signal{dir: dir, perm: perm, held: map[string]string{}, offsets: map[int64]int{}, yield: map[string]time.Time{}, marks: map[int64]int{}}
	s.watches = sqlcommon.NewWatches(func(_ context.Context, name string) (sqlcommon.Waiter, error) {
		off := offset(name)
		f, err := openLocker(s.path(off), false, s.perm)
		if err != nil {
			return nil, err
		}
		return waiter{f, off}, nil
	}, nil)
	return s
}

// path is the shard file of byte off.
func (s *signal) path(off int64) string {
	return filepath.Join(s.dir, strconv.Itoa(shardOf(off)))
}

// file is this driver's open of the shard of byte off, opened (for
// writing when it can be) on first use; nil when it cannot be opened, or
// only for reading and write is asked for. s.mu is held.
func (s *signal) file(off int64, write bool) fileLocker {
	sf := &s.files[shardOf(off)]
	if sf.f == nil && !sf.failed {
		if f, err := openLocker(s.path(off), true, s.perm); err == nil {
			sf.f = f
		} else if f, err := openLocker(s.path(off), false, s.perm); err == nil {
			sf.f, sf.readOnly = f, true
		} else {
			sf.failed = true
		}
	}
	if write && sf.readOnly {
		return nil
	}
	return sf.f
}

// offset maps a lock name to its byte in its shard file (shardOf(offset)
// is its shard): the 64-bit FNV-1a hash of the name, its top two bits
// cleared.
func offset(name string) int64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return int64(h & (1<<62 - 1))
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
	if s.closed {
		return
	}
	if _, ok := s.held[key]; ok {
		s.held[key] = owner // a grant that lapsed here unreleased
		return
	}
	off := offset(name)
	f := s.file(off, true)
	if f == nil {
		return
	}
	s.held[key] = owner
	s.offsets[off]++
	if s.offsets[off] > 1 {
		return
	}
	for i := 0; i < 50; i++ {
		ok, err := f.try(off, true, false)
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
	f := s.files[shardOf(off)].f // open: it holds off
	_, _ = f.try(off, false, true)
	// Waiters watch the name: this driver's own subscribers (its mark),
	// or another driver's mark on the byte.
	w := s.marks[waitersOff(off)] > 0
	if !w {
		o, err := f.others(waitersOff(off))
		w = err == nil && o
	}
	if !w {
		return
	}
	if len(s.yield) >= 256 {
		for n, u := range s.yield {
			if time.Until(u) <= 0 {
				delete(s.yield, n)
			}
		}
	}
	s.yield[name] = time.Now().Add(yieldFor)
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
	f := s.file(off, false)
	if f == nil {
		return func() {}
	}
	if s.marks[off]++; s.marks[off] == 1 {
		// Nobody takes that byte exclusively: the shared lock is granted.
		_, _ = f.try(off, false, false)
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed || s.marks[off] == 0 {
			return
		}
		if s.marks[off]--; s.marks[off] == 0 {
			delete(s.marks, off)
			_, _ = f.try(off, false, true)
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
// Such an attempt is delayed by that time, then asks the table (it used to
// be refused as if the lock were held, and the refused Lock then waited
// the time out and one more millisecond: a hand-off took 1.7–3.4 ms, 1.1
// ms now). The stand-back ends early once nobody watches the name any
// more (this driver has no subscribers of its own for it and no other
// driver marks it), so a TryLock after the waiters are gone is answered by
// the table at once, as before.
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
		if f := s.files[shardOf(off)].f; f == nil {
			left = 0
		} else if w, err := f.others(off); err != nil || !w {
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
	for i := range s.files {
		if f := s.files[i].f; f != nil {
			_ = f.close()
		}
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
