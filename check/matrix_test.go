package check

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testserver"
)

// matrixCell is one backend × fault run of the CI matrix.
type matrixCell struct {
	fault string
	// mustAdmit: the run must report violations, all admitted by the docs.
	mustAdmit bool
}

// matrixBackend is one backend of the CI matrix: its servers are started
// once and shared by its cells.
type matrixBackend struct {
	backend string
	name    string // the subtest's name, when not the backend's
	ttl     time.Duration
	cells   []matrixCell
}

func cells(faults ...string) []matrixCell {
	out := make([]matrixCell, len(faults))
	for i, f := range faults {
		out[i] = matrixCell{fault: f}
	}
	return out
}

// matrix is every backend × the faults that apply to it. Each cell is short
// (a few seconds, 2 workers × 2 goroutines): the point is that every fault
// runs on every backend in CI; docs/checker.md has a longer run's numbers.
var matrix = []matrixBackend{
	{backend: "sqlite", cells: cells(FaultNone, FaultPauseHolder, FaultKillHolder)},
	{backend: "redis", cells: append(cells(clientSide...), append(cells(FaultRestartServer, FaultPauseServer, FaultClockJump),
		matrixCell{fault: FaultRestartWiped, mustAdmit: true})...)},
	{backend: "redis-sentinel/wait", cells: cells(FaultFailoverMaster)},
	{backend: "redis-sentinel/async", cells: []matrixCell{{fault: FaultFailoverMaster, mustAdmit: true}}},
	{backend: "redlock", cells: cells(append(clientSide, FaultRestartServer, FaultRestartWiped, FaultPauseServer, FaultClockJump)...)},
	{backend: "quorum", cells: cells(append(clientSide, FaultRestartServer, FaultRestartWiped, FaultPauseServer, FaultClockJump)...)},
	{backend: "etcd", ttl: 2 * time.Second, cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer)...)},
	{backend: "etcd", name: "etcd-3", ttl: 2 * time.Second, cells: cells(FaultKillLeader)},
	{backend: "zk", ttl: 2 * time.Second, cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer)...)},
	{backend: "zk", name: "zk-3", ttl: 2 * time.Second, cells: cells(FaultKillLeader)},
	{backend: "postgres/lease", cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer, FaultClockJump)...)},
	{backend: "postgres/advisory", cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer, FaultKillSession)...)},
	{backend: "postgres/rowlock", cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer, FaultKillSession)...)},
	{backend: "mysql/lease", cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer, FaultClockJump)...)},
	{backend: "mysql/getlock", cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer, FaultKillSession)...)},
	{backend: "mysql/rowlock", cells: cells(append(clientSide, FaultRestartServer, FaultPauseServer, FaultKillSession)...)},
	// A TTL of 3s or more makes rowlock waiters wait in the server (a
	// locking read under innodb_lock_wait_timeout, whole seconds).
	{backend: "mysql/rowlock", name: "mysql-rowlock-3s", ttl: 3 * time.Second, cells: cells(FaultPauseHolder, FaultKillHolder, FaultPartition, FaultRestartServer, FaultKillSession)},
}

// clientSide are the faults that apply to every networked backend.
var clientSide = []string{FaultPauseHolder, FaultKillHolder, FaultPartition, FaultLatency}

// TestMatrix runs the checker over the matrix. A cell fails when the
// checker finds a violation the docs do not admit. Set DLOCK_CHECK_MATRIX
// to a backend name (or a comma-separated list) to run only those.
func TestMatrix(t *testing.T) {
	only := os.Getenv("DLOCK_CHECK_MATRIX")
	for _, mb := range matrix {
		name := mb.name
		if name == "" {
			name = strings.ReplaceAll(mb.backend, "/", "-")
		}
		if only != "" && !contains2(strings.Split(only, ","), name) {
			continue
		}
		t.Run(name, func(t *testing.T) {
			var faults []string
			for _, c := range mb.cells {
				faults = append(faults, c.fault)
			}
			ttl := mb.ttl
			if ttl == 0 {
				ttl = time.Second
			}
			srv, err := StartServers(mb.backend, faults, ttl)
			if errors.Is(err, testserver.ErrNotInstalled) && os.Getenv("CI") != "true" {
				t.Skipf("start servers: %v", err) // with CI=true a missing server fails the cell
			}
			if err != nil {
				t.Fatalf("start servers: %v", err)
			}
			defer srv.Stop()
			for _, c := range mb.cells {
				t.Run(c.fault, func(t *testing.T) {
					cfg := Config{Spawn: mb.backend, Servers: srv, Faults: []string{c.fault}, TTL: ttl, Duration: 2*ttl + 2*time.Second}
					_, rep := runCheck(t, cfg)
					if c.fault != FaultNone && rep.Faults == 0 && !rep.Failed() {
						// The fault needs a holder at the right moment (a
						// session to kill, a worker to stop); on a loaded
						// machine a short cell can end before one is found.
						// That is no verdict: run the cell once more, longer.
						t.Logf("%s was never injected in %v; running the cell again for twice as long", c.fault, cfg.Duration)
						cfg.Duration *= 2
						_, rep = runCheck(t, cfg)
					}
					if rep.Failed() {
						t.Errorf("violations the docs do not admit")
					}
					if rep.Grants == 0 {
						t.Errorf("no grants")
					}
					if c.fault != FaultNone && rep.Faults == 0 {
						t.Errorf("the fault was never injected")
					}
					if c.mustAdmit {
						total := 0
						for _, cl := range rep.Classes {
							total += cl.Count
						}
						if total == 0 {
							t.Errorf("%s on %s must show violations (admitted by the docs); the checker found none", c.fault, mb.backend)
						}
					}
				})
			}
		})
	}
}

func contains2(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
