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
)

// TestProcessStopQuiesces: Ctrl-Z makes dlock let its backend calls in
// flight finish before it stops (a dlock stopped in the middle of a write
// on SQLite would keep the file's write lock, refusing every other client
// of the file until fg). Here another process holds the file's write lock,
// so the renewal in flight cannot finish: dlock waits for it for its bound
// (2s), says so, and stops anyway.
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
	if !strings.Contains(out.String(), "stopping with a backend call still running") {
		t.Errorf("dlock stopped without waiting for its renewal in flight; output: %s", out)
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
