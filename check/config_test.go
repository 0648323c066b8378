package check

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestAppliesTable(t *testing.T) {
	for _, tc := range []struct {
		backend, fault string
		spawned        bool
		ok             bool
		why            string
	}{
		{"sqlite", FaultPauseHolder, false, true, ""},
		{"sqlite", FaultPartition, true, false, "no network"},
		{"redis", FaultPartition, false, true, ""},
		{"redis", FaultRestartServer, false, false, "--spawn"},
		{"redis", FaultRestartWiped, true, true, ""},
		{"etcd", FaultRestartWiped, true, false, "persistence"},
		{"etcd", FaultKillLeader, true, true, ""},
		{"redis", FaultKillLeader, true, false, "leader"},
		{"postgres/lease", FaultKillSession, true, false, "session"},
		{"postgres/advisory", FaultKillSession, true, true, ""},
		{"mysql/getlock", FaultKillSession, true, true, ""},
		{"zk", FaultClockJump, true, false, "libfaketime"},
		{"redis", "explode", true, false, "unknown fault"},
	} {
		err := Applies(tc.backend, tc.fault, tc.spawned)
		if (err == nil) != tc.ok {
			t.Errorf("Applies(%s, %s, %v) = %v, want ok=%v", tc.backend, tc.fault, tc.spawned, err, tc.ok)
			continue
		}
		if err != nil && !strings.Contains(err.Error(), tc.why) {
			t.Errorf("Applies(%s, %s): %v, want it to say %q", tc.backend, tc.fault, err, tc.why)
		}
	}
}

// TestRunRefusesBadConfig: bad input is refused before anything starts,
// with an error wrapping ErrBadConfig that never shows the URL's password.
func TestRunRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"nothing", Config{}, "exactly one"},
		{"both", Config{URL: "redis://h:1/0", Spawn: "redis"}, "exactly one"},
		{"bad spawn", Config{Spawn: "oracle"}, "cannot spawn"},
		{"bad mode", Config{Spawn: "postgres/magic"}, "unknown postgres mode"},
		{"mode on redis", Config{Spawn: "redis/x"}, "no modes"},
		{"fault n/a", Config{Spawn: "sqlite", Faults: []string{FaultLatency}}, "no network"},
		{"server fault on url", Config{URL: "redis://:hunter2@h:1/0", Faults: []string{FaultPauseServer}}, "--spawn"},
		{"workers", Config{Spawn: "sqlite", Workers: -1}, "workers"},
		{"ttl", Config{Spawn: "sqlite", TTL: time.Millisecond}, "ttl"},
		{"hold", Config{Spawn: "sqlite", HoldMax: 5 * time.Second}, "hold"},
		{"url", Config{URL: "::nope"}, "cannot be parsed"},
		{"mem", Config{URL: "mem://x"}, "one process"},
		{"proxy needs ports", Config{URL: "redis://:hunter2@localhost/0", Faults: []string{FaultPartition}, WorkerCommand: []string{"/nonexistent"}}, "explicit port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), tc.cfg)
			if !errors.Is(err, ErrBadConfig) {
				t.Fatalf("Run: %v, want ErrBadConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Run: %v, want it to say %q (and no password)", err, tc.want)
			}
		})
	}
}

// TestRunWorkerCannotStart: a backend no worker can open is an error of
// the run, not a violation, and the error hides the password.
func TestRunWorkerCannotStart(t *testing.T) {
	_, err := Run(context.Background(), Config{URL: "redis://:hunter2@127.0.0.1:1/0", Workers: 1, Goroutines: 1,
		Duration: time.Second, WorkerCommand: testCommand(t)})
	if err == nil || errors.Is(err, ErrBadConfig) {
		t.Fatalf("Run: %v, want a start failure", err)
	}
	if !strings.Contains(err.Error(), "could not start") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("Run: %v", err)
	}
}
