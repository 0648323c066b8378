package sqlitelock

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// gateState reads the gate's counters.
func (g *gate) state() (running, waiting int, shut bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, g.waiting, g.shut != nil
}

// holdFile takes the write lock of the SQLite file at path from a
// connection of its own, as another process writing would, and returns
// the function that lets it go.
func holdFile(t *testing.T, path string) (conn *sql.Conn, release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", path) // no busy_timeout: fails at once if the file is busy
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	conn, err = db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("BEGIN IMMEDIATE: %v", err)
	}
	return conn, func() {
		if _, err := conn.ExecContext(context.Background(), "COMMIT"); err != nil {
			t.Fatalf("COMMIT: %v", err)
		}
	}
}

// newLongBusy returns a driver made by New over a *sql.DB of one
// connection to path whose SQLite busy timeout is a minute: a statement
// waiting for the file then stays in SQLite, inside the driver's gate, for
// as long as the file is busy. (A driver Open made waits busyStep in SQLite
// and leaves the gate between tries, where a Quiesce may come in.)
func newLongBusy(t *testing.T, path string) *Driver {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(60000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	d, err := New(db, &Options{BusyTimeout: time.Minute})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestQuiesceWaitsForRunningStatements: Quiesce waits for a renewal in
// flight (here held up by another process's write lock on the file),
// holds new statements back until resume, and when it returns the driver
// holds no write lock on the file: another writer gets it at once. This is
// what "dlock run" relies on before stopping itself on Ctrl-Z.
func TestQuiesceWaitsForRunningStatements(t *testing.T) {
	path := tempDB(t)
	d := newLongBusy(t, path)
	g := mustAcquire(t, d, req("a", "alice", time.Minute, 0))

	conn, letGo := holdFile(t, path)
	renewed := make(chan error, 1)
	go func() {
		_, err := d.Renew(context.Background(), []driver.Lease{lease("a", "alice", g.Token, time.Minute, 0)})
		renewed <- err
	}()
	testwait.Until(t, 10*time.Second, "the renewal waiting for the file", func() bool {
		r, _, _ := d.gate.state()
		return r == 1
	})

	type result struct {
		resume func()
		err    error
	}
	quiesced := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		resume, err := d.Quiesce(ctx)
		quiesced <- result{resume, err}
	}()
	testwait.Until(t, 10*time.Second, "Quiesce shutting the gate", func() bool {
		_, _, shut := d.gate.state()
		return shut
	})
	acquired := make(chan error, 1)
	go func() {
		_, err := d.TryAcquire(context.Background(), req("b", "alice", time.Minute, 0))
		acquired <- err
	}()
	testwait.Until(t, 10*time.Second, "TryAcquire held back by the quiesced driver", func() bool {
		_, w, _ := d.gate.state()
		return w == 1
	})
	select {
	case r := <-quiesced:
		t.Fatalf("Quiesce returned (err %v) while a renewal was still running", r.err)
	default:
	}

	letGo() // the renewal goes on and ends; Quiesce returns
	var r result
	select {
	case r = <-quiesced:
	case <-time.After(10 * time.Second):
		t.Fatal("Quiesce did not return within 10s of the renewal's end")
	}
	if r.err != nil {
		t.Fatalf("Quiesce: %v", r.err)
	}
	if err := <-renewed; err != nil {
		t.Fatalf("Renew: %v", err)
	}
	// Quiesced: the file's write lock is free, another writer takes it
	// without waiting, and the held-back TryAcquire has not run.
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("BEGIN IMMEDIATE from another connection while quiesced: %v", err)
	}
	if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	other := openTest(t, path, &Options{BusyTimeout: time.Millisecond})
	mustAcquire(t, other, req("c", "bob", time.Minute, 0))
	select {
	case err := <-acquired:
		t.Fatalf("TryAcquire ran while quiesced (err %v)", err)
	default:
	}
	if _, w, _ := d.gate.state(); w != 1 {
		t.Fatalf("%d statements held back while quiesced, want 1", w)
	}

	r.resume()
	r.resume() // a second call does nothing
	select {
	case err := <-acquired:
		if err != nil {
			t.Fatalf("TryAcquire after resume: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("TryAcquire still held back 10s after resume")
	}
	if _, err := d.Renew(context.Background(), []driver.Lease{lease("a", "alice", g.Token, time.Minute, 0)}); err != nil {
		t.Fatalf("Renew after resume: %v", err)
	}
}

// TestQuiesceBounded: a Quiesce whose context ends while a statement still
// runs returns an error wrapping the context's, and holds nothing back;
// a held-back call ends with its own context.
func TestQuiesceBounded(t *testing.T) {
	path := tempDB(t)
	d := newLongBusy(t, path)
	letGo, acquired := acquireBehindFile(t, d, path)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	resume, err := d.Quiesce(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || resume != nil {
		t.Fatalf("Quiesce with a statement running past its context = %v (resume nil: %v), want a deadline error and no resume", err, resume == nil)
	}
	if _, _, shut := d.gate.state(); shut {
		t.Fatal("a failed Quiesce left the driver quiesced")
	}
	letGo()
	if out := <-acquired; out.Err != nil {
		t.Fatalf("TryAcquire: %v", out.Err)
	}

	// Quiesced, a call whose context ends gives up with its context's error.
	resume, err = d.Quiesce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer resume()
	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ccancel()
	if _, err := d.TryAcquire(cctx, req("b", "alice", time.Minute, 0)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire on a quiesced driver past its context = %v, want a deadline error", err)
	}

	// A second Quiesce waits for the first one's resume.
	second := make(chan func(), 1)
	go func() {
		r, err := d.Quiesce(context.Background())
		if err != nil {
			t.Errorf("second Quiesce: %v", err)
		}
		second <- r
	}()
	select {
	case <-second:
		t.Fatal("a second Quiesce returned before the first one's resume")
	default:
	}
	resume()
	select {
	case r := <-second:
		if r != nil {
			r()
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second Quiesce still waiting 10s after the first one's resume")
	}
	if _, err := d.TryAcquire(context.Background(), req("b", "alice", time.Minute, 0)); err != nil {
		t.Fatalf("TryAcquire after resume: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Quiesce(context.Background()); !errors.Is(err, errClosed) {
		t.Fatalf("Quiesce after Close = %v, want errClosed", err)
	}
}

// TestQuiesceBetweenBusyTries: on a driver Open made, a statement waiting
// for a file another process keeps busy leaves the gate between its tries
// (SQLite waits busyStep per try), so a Quiesce does not wait for the
// other process: it comes in between two tries and holds the next back.
func TestQuiesceBetweenBusyTries(t *testing.T) {
	path := tempDB(t)
	d := openTest(t, path, &Options{BusyTimeout: time.Minute})
	letGo, acquired := acquireBehindFile(t, d, path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resume, err := d.Quiesce(ctx)
	if err != nil {
		t.Fatalf("Quiesce while the file is busy: %v", err)
	}
	testwait.Until(t, 10*time.Second, "the busy TryAcquire held back", func() bool {
		_, w, _ := d.gate.state()
		return w == 1
	})
	letGo()
	resume()
	if out := <-acquired; out.Err != nil {
		t.Fatalf("TryAcquire after resume: %v", out.Err)
	}
}

// acquireBehindFile takes the write lock of the file at path from another
// connection (holdFile), starts a TryAcquire on d, waits until it is
// inside d's gate waiting for the file, and returns the function that lets
// the file go and the TryAcquire's outcome.
func acquireBehindFile(t *testing.T, d *Driver, path string) (letGo func(), acquired <-chan testwait.Outcome[driver.Grant]) {
	t.Helper()
	_, letGo = holdFile(t, path)
	acquired = testwait.Go(func() (driver.Grant, error) {
		return d.TryAcquire(context.Background(), req("a", "alice", time.Minute, 0))
	})
	testwait.Until(t, 10*time.Second, "TryAcquire waiting for the file", func() bool {
		r, _, _ := d.gate.state()
		return r == 1
	})
	return letGo, acquired
}
