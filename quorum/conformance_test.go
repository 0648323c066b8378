package quorum_test

import (
	"testing"

	"github.com/dlock/dlock/locktest"
)

// The conformance suite over quorums of each kind of node. The runs share
// nothing, so they run in parallel: most of each is waiting for expiry.

func TestConformanceRedis3(t *testing.T) {
	t.Parallel()
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode { return redisNodes(t, 3) }))
}

func TestConformanceRedis5(t *testing.T) {
	t.Parallel()
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode { return redisNodes(t, 5) }))
}

func TestConformanceSQLite3(t *testing.T) {
	t.Parallel()
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode {
		return []*testNode{sqliteNode(t), sqliteNode(t), sqliteNode(t)}
	}))
}

// TestConformanceMixed3 is one node of each: Redis, PostgreSQL, SQLite.
func TestConformanceMixed3(t *testing.T) {
	t.Parallel()
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode {
		return append(redisNodes(t, 1), pgNode(t), sqliteNode(t))
	}))
}

// TestConformanceMixed5 is two Redis masters, two PostgreSQL servers and
// an SQLite file.
func TestConformanceMixed5(t *testing.T) {
	t.Parallel()
	locktest.RunConformanceTests(t, newHarness(func(t testing.TB) []*testNode {
		return append(redisNodes(t, 2), pgNode(t), pgNode(t), sqliteNode(t))
	}))
}
