package main

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

// TestProcessStopQuiesces: Ctrl-Z makes dlock let its backend calls in
// flight finish before it stops (a dlock stopped in the middle of a write
// on SQLite would keep the file's write lock, refusing every other client
// of the file until fg). Here another process holds the file's write lock,
// so the renewal in flight cannot finish; it waits between tries outside
// the driver's gate (SQLite waits 1 ms per try), so the Quiesce comes in
// between two tries and dlock stops without the warning of a call still
// running (TestStopBoundedQuiesce covers that warning), and the renewal
// goes on after fg.
func TestProcessStopQuiesces(t *testing.T) {
	dbURL, path := sqliteTestURL(t)
	// The renewal waits for the file's write lock longer than the test.
	cmd, out, child, release, _ := startStoppable(t, dbURL+"?busy_timeout=1m", "--ttl", "9s")

	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)") // waits out a write of dlock's in progress
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}).String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	committed := false
	defer func() {
		if !committed {
			conn.ExecContext(ctx, "ROLLBACK")
		}
	}()
	// The lease is renewed every TTL/3 (3s), 6s before it ends: wait until
	// a renewal is 1.5s overdue, so it is surely waiting for the file.
	waitFor(t, "a renewal of dlock's lease to be due", time.Minute, func() bool {
		var until, now int64
		err := conn.QueryRowContext(ctx, `SELECT lock_until, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
FROM dlock_locks WHERE name = 'jobctl'`).Scan(&until, &now)
		if err != nil {
			t.Fatal(err)
		}
		return now >= until-4500
	})
	if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "child and dlock to stop", time.Minute, func() bool {
		return stopped(child) && stopped(cmd.Process.Pid)
	})
	if strings.Contains(out.String(), "stopping with a backend call still running") {
		t.Errorf("dlock waited for a renewal that was only waiting for the file; output: %s", out)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	committed = true
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The renewal either made it in time (exit 0) or not (lease lost).
	if code := waitExit(t, cmd, time.Minute); code != 0 && code != exitLeaseLost {
		t.Fatalf("exit %d: %s", code, out)
	}
}

// quiesceBlocked is a driver whose Quiesce never finishes before its
// context ends, as one with a statement stuck inside its gate.
type quiesceBlocked struct{ driver.Driver }

func (quiesceBlocked) Quiesce(ctx context.Context) (func(), error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStopBoundedQuiesce: when the calls in flight do not finish within
// quiesceTimeout, Ctrl-Z says so and stops anyway (job control must work),
// with nothing to resume.
func TestStopBoundedQuiesce(t *testing.T) {
	c := dlock.New(quiesceBlocked{memlock.NewBackend().NewDriver()}, nil)
	defer c.Close()
	var sc stopClient
	sc.set(c)
	te := newTestEnv(nil)
	halted := 0
	sc.stopWith(te.env(), func() { halted++ })
	if halted != 1 {
		t.Fatalf("stopped %d times, want 1", halted)
	}
	if !strings.Contains(te.stderr.String(), "stopping with a backend call still running") {
		t.Fatalf("no warning of the call still running; stderr: %q", te.stderr.String())
	}
}
