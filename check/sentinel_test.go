package check

import (
	"testing"
	"time"
)

// TestSentinelConfig: redis-sentinel spawns in mode wait by default, a URL's
// mode follows its min_replicas, failover-master applies to redis-sentinel
// only, and redis-sentinel takes no fault aimed at one server or a proxy.
func TestSentinelConfig(t *testing.T) {
	c := Config{Spawn: "redis-sentinel", Faults: []string{FaultFailoverMaster}}
	if err := c.defaults(); err != nil || c.Spawn != "redis-sentinel/wait" || c.backendKind() != "redis-sentinel/wait" {
		t.Errorf("spawn redis-sentinel: %q, %v", c.Spawn, err)
	}
	for raw, want := range map[string]string{
		"redis-sentinel://h:1/0?master_name=m":                "redis-sentinel/async",
		"redis-sentinel://h:1/0?master_name=m&min_replicas=0": "redis-sentinel/async",
		"redis-sentinel://h:1/0?master_name=m&min_replicas=2": "redis-sentinel/wait",
	} {
		c := Config{URL: raw, Duration: time.Second}
		if err := c.defaults(); err != nil || c.backendKind() != want {
			t.Errorf("%s: backend %q, %v; want %s", raw, c.backendKind(), err, want)
		}
	}
	for _, tc := range []struct {
		backend, fault string
		ok             bool
	}{
		{"redis-sentinel/wait", FaultFailoverMaster, true},
		{"redis-sentinel/async", FaultKillHolder, true},
		{"redis-sentinel/async", FaultPartition, false},
		{"redis-sentinel/wait", FaultRestartServer, false},
		{"redis", FaultFailoverMaster, false},
		{"etcd", FaultFailoverMaster, false},
	} {
		if err := Applies(tc.backend, tc.fault, true); (err == nil) != tc.ok {
			t.Errorf("Applies(%s, %s) = %v, want ok %v", tc.backend, tc.fault, err, tc.ok)
		}
	}
	if _, ok := Admission("redis-sentinel/async", "", FaultFailoverMaster, ClassDuplicateToken); !ok {
		t.Error("a duplicate token of redis-sentinel/async under failover-master is not admitted")
	}
	if _, ok := Admission("redis-sentinel/wait", "", FaultFailoverMaster, ClassDuplicateToken); ok {
		t.Error("a duplicate token of redis-sentinel/wait under failover-master is admitted")
	}
}
