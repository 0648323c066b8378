package quorum_test

import (
	"testing"

	"github.com/dlock/dlock/locktest"
)

// The conformance suite over quorums of each kind of node. They run one
// after the other, before the parallel tests: the suite's leak check counts
// the whole process's goroutines and sockets.

func TestConformanceRedis3(t *testing.T) {
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode { return redisNodes(t, 3) }))
}

func TestConformanceRedis5(t *testing.T) {
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode { return redisNodes(t, 5) }))
}

// TestConformanceMixed3 is one node of each: Redis, PostgreSQL, SQLite.
func TestConformanceMixed3(t *testing.T) {
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode {
		return append(redisNodes(t, 1), pgNode(t), sqliteNode(t))
	}))
}

// TestConformanceMixed5 is three Redis masters and two PostgreSQL servers
// (SQLite, some 30 times slower under -race, is in Mixed3: one suite with
// it takes as long as three without).
func TestConformanceMixed5(t *testing.T) {
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode {
		return append(redisNodes(t, 3), pgNode(t), pgNode(t))
	}))
}

func BenchmarkLocksRedis3(b *testing.B) {
	locktest.RunBenchmarks(b, newHarness(func(t testing.TB) []*testNode { return redisNodes(t, 3) }))
}
