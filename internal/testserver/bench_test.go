package testserver_test

import (
	"testing"

	"github.com/dlock/dlock/internal/testserver"
)

// BenchmarkStart measures each kind's start-up: from the call until the
// server answers a real request. Stopping is not timed.
func BenchmarkStart(b *testing.B) {
	kinds := []struct {
		name  string
		start func() (interface{ Stop() }, error)
	}{
		{"redis", func() (interface{ Stop() }, error) { return testserver.StartRedis(nil) }},
		{"etcd-1", func() (interface{ Stop() }, error) { return testserver.StartEtcd(1) }},
		{"etcd-3", func() (interface{ Stop() }, error) { return testserver.StartEtcd(3) }},
		{"zookeeper-1", func() (interface{ Stop() }, error) { return testserver.StartZooKeeper(1) }},
		{"zookeeper-3", func() (interface{ Stop() }, error) { return testserver.StartZooKeeper(3) }},
		{"postgres", func() (interface{ Stop() }, error) { return testserver.StartPostgres(nil) }},
		{"mariadb", func() (interface{ Stop() }, error) { return testserver.StartMariaDB(nil) }},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				s, err := k.start()
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				s.Stop()
				b.StartTimer()
			}
		})
	}
}
