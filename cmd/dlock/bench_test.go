package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/testserver"
)

// TestBenchTable: "dlock bench" on mem:// prints one table row per
// scenario, the raw floor beside dlock, and a progress line on stderr.
func TestBenchTable(t *testing.T) {
	mem, _ := memURL()
	te := newTestEnv(nil)
	if code := te.run("bench", "--url", mem, "--duration", "1s", "--held", "50"); code != exitOK {
		t.Fatalf("exit %d; stderr: %s", code, te.stderr.String())
	}
	out := te.stdout.String()
	for _, want := range []string{
		"backend  " + mem,
		"SCENARIO", "P50", "P99",
		"Lock+Unlock, uncontended", "the raw floor",
		"raw floor: map insert + delete under a mutex",
		"hot lock hand-off, 8 goroutines", "ops/s",
		"wake-up of a blocked waiter",
		"fairness: Lock wait, 9 contenders holding", "longest wait", "fewest grants per goroutine",
		"Lock+Unlock, 0 leases held",
		"Lock+Unlock, 50 leases held", "B of heap per lease",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(te.stderr.String(), "dlock bench: hot lock, 8 goroutines") {
		t.Errorf("no progress line on stderr: %q", te.stderr.String())
	}
}

// TestBenchJSONSQLite: --json on an SQLite file gives every measurement,
// with samples, and the SQLite raw floor.
func TestBenchJSONSQLite(t *testing.T) {
	db, _ := sqliteTestURL(t)
	te := newTestEnv(nil)
	if code := te.run("bench", "--url", db, "--json", "--duration", "1s", "--held", "20", "--goroutines", "4"); code != exitOK {
		t.Fatalf("exit %d; stderr: %s", code, te.stderr.String())
	}
	var rep struct {
		URL         string
		Floor       string
		Uncontended struct{ N, P50_ns, P99_ns int64 } `json:"uncontended"`
		FloorStats  struct{ N, P50_ns int64 }         `json:"floor_uncontended"`
		XFloor      float64                           `json:"x_floor"`
		Hot         struct {
			Goroutines int
			Handoff    struct{ N, P50_ns int64 }
			OpsPerSec  float64 `json:"ops_per_sec"`
		} `json:"hot_lock"`
		Wake struct{ N, P50_ns int64 }
		Fair struct {
			Contenders int
			Hold       int64 `json:"hold_ns"`
			Wait       struct{ N, P50_ns int64 }
			MaxWait    int64 `json:"max_wait_ns"`
			MinGrants  int   `json:"min_grants"`
		} `json:"fairness"`
		Held struct {
			Levels []struct {
				Held int
				Op   struct{ N, P50_ns int64 }
			}
			BytesPerLease float64 `json:"bytes_per_lease"`
		} `json:"many_held"`
	}
	var loose map[string]any
	if err := json.Unmarshal([]byte(te.stdout.String()), &loose); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, te.stdout.String())
	}
	if err := json.Unmarshal([]byte(te.stdout.String()), &rep); err != nil {
		t.Fatalf("unexpected JSON shape: %v\n%s", err, te.stdout.String())
	}
	for _, k := range []string{"url", "floor", "uncontended", "floor_uncontended", "x_floor", "round_trip", "hot_lock", "wake", "fairness", "many_held", "elapsed_ns"} {
		if _, ok := loose[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, te.stdout.String())
		}
	}
	switch {
	case rep.URL != db:
		t.Errorf("url %q, want %q", rep.URL, db)
	case rep.Floor != "INSERT + DELETE of a row":
		t.Errorf("floor %q", rep.Floor)
	case rep.Uncontended.N == 0 || rep.Uncontended.P50_ns <= 0 || rep.Uncontended.P99_ns < rep.Uncontended.P50_ns:
		t.Errorf("uncontended %+v", rep.Uncontended)
	case rep.FloorStats.N != rep.Uncontended.N || rep.XFloor <= 0:
		t.Errorf("floor %+v, x_floor %v: want as many samples as dlock's (interleaved)", rep.FloorStats, rep.XFloor)
	case rep.Hot.Goroutines != 4 || rep.Hot.Handoff.N == 0 || rep.Hot.OpsPerSec <= 0:
		t.Errorf("hot lock %+v", rep.Hot)
	case rep.Wake.N == 0:
		t.Errorf("wake %+v", rep.Wake)
	case rep.Fair.Contenders != 9 || rep.Fair.Hold <= 0 || rep.Fair.Wait.N == 0 || rep.Fair.MaxWait < rep.Fair.Wait.P50_ns:
		t.Errorf("fairness %+v", rep.Fair)
	case len(rep.Held.Levels) != 2 || rep.Held.Levels[0].Held != 0 || rep.Held.Levels[1].Held != 20 || rep.Held.Levels[1].Op.N == 0:
		t.Errorf("many held %+v", rep.Held)
	}
}

// TestBenchBadInput: bad flags and URLs are bad input (exit 64) named in
// the message; an unreachable backend is exit 69; a password is never
// printed.
func TestBenchBadInput(t *testing.T) {
	mem, _ := memURL()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"negative duration", []string{"bench", "--url", mem, "--duration", "-1s"}, exitUsage, "--duration must be positive"},
		{"zero duration", []string{"bench", "--url", mem, "--duration", "0s"}, exitUsage, "--duration must be positive"},
		{"bad duration", []string{"bench", "--url", mem, "--duration", "soon"}, exitUsage, "--duration"},
		{"negative held", []string{"bench", "--url", mem, "--held", "-5"}, exitUsage, "--held must not be negative"},
		{"one goroutine", []string{"bench", "--url", mem, "--goroutines", "1"}, exitUsage, "--goroutines must be at least 2"},
		{"argument", []string{"bench", "--url", mem, "extra"}, exitUsage, "unknown command"},
		{"unknown scheme", []string{"bench", "--url", "nosuch://u:hunter2secret@h/x", "--duration", "1s"}, exitUsage, `unknown scheme "nosuch"`},
		{"bad url parameter", []string{"bench", "--url", mem + "?ttl=soon", "--duration", "1s"}, exitUsage, "parameter ttl"},
		{"unreachable", []string{"bench", "--url", "redis://:hunter2secret@127.0.0.1:1/0", "--duration", "1s"}, exitUnavailable, "bench:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestEnv(nil)
			if code := te.run(tc.args...); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tc.code, te.stderr.String())
			}
			if !strings.Contains(te.stderr.String(), tc.want) {
				t.Errorf("stderr does not name %q: %s", tc.want, te.stderr.String())
			}
			if strings.Contains(te.stderr.String()+te.stdout.String(), "hunter2secret") {
				t.Errorf("output shows the password: %s", te.stderr.String())
			}
			if te.stdout.String() != "" {
				t.Errorf("stdout %q, want nothing", te.stdout.String())
			}
		})
	}
}

// TestBenchHeldBeyondPool: a session-bound mode cannot hold more locks than
// its pool has connections; the bench says so under the table and still
// reports everything else (exit 0).
func TestBenchHeldBeyondPool(t *testing.T) {
	srv := testserver.Postgres(t)
	u := srv.URL() + "&mode=advisory&pool_max_conns=4"
	te := newTestEnv(nil)
	if code := te.run("bench", "--url", u, "--duration", "1s", "--held", "10", "--goroutines", "2"); code != exitOK {
		t.Fatalf("exit %d; stderr: %s", code, te.stderr.String())
	}
	out := te.stdout.String()
	for _, want := range []string{"Lock+Unlock, 0 leases held", "many held: could not hold lock", "wake-up of a blocked waiter"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
