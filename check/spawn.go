package check

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/testserver"
)

// Servers are backend servers the checker started on loopback (from the
// programs internal/testserver runs), with their fault controls. Run starts
// its own when Config.Spawn is set; a caller running many checks against one
// backend (the test matrix) starts them once with StartServers and passes
// them in Config.Servers. Stop them with Stop.
type Servers struct {
	kind, mode string
	url        string // the URL workers use, mode and TTL parameters included
	members    []*testserver.Server
	cluster    *testserver.Cluster
	sentinel   *testserver.SentinelSet // redis-sentinel
	dir        string                  // sqlite: the directory of the file
	faketime   bool
}

// StartServers starts the servers of backend (a Spawn value:
// "redis", "postgres/advisory", …) ready for the given faults: 3 members for
// kill-leader, 3 nodes for redlock and quorum, persistence on Redis, libfaketime for
// clock-jump. ttl is the lease TTL the runs will use (etcd's session TTL and
// ZooKeeper's session timeout are set to it).
func StartServers(backend string, faults []string, ttl time.Duration) (*Servers, error) {
	c := Config{Spawn: backend, Faults: faults, TTL: ttl, Duration: time.Minute}
	if err := c.defaults(); err != nil {
		return nil, err
	}
	kind, mode, _ := strings.Cut(c.Spawn, "/")
	s := &Servers{kind: kind, mode: mode, faketime: slices.Contains(c.Faults, FaultClockJump)}
	var err error
	switch kind {
	case "sqlite":
		s.dir, err = os.MkdirTemp("", "dlock-check-")
		s.url = "sqlite://" + filepath.Join(s.dir, "locks.db")
	case "redis":
		var m *testserver.Server
		m, err = testserver.StartRedis(&testserver.RedisOptions{AppendOnly: true, Faketime: s.faketime})
		if err == nil {
			s.members = []*testserver.Server{m}
			s.url = m.URL()
		}
	case "redlock", "quorum":
		var hosts, nodes []string
		for range 3 {
			var m *testserver.Server
			m, err = testserver.StartRedis(&testserver.RedisOptions{AppendOnly: true, Faketime: s.faketime})
			if err != nil {
				break
			}
			s.members = append(s.members, m)
			hosts = append(hosts, m.Addr())
			nodes = append(nodes, "node="+url.QueryEscape("redis://"+m.Addr()+"/0"))
		}
		s.url = "redlock://" + strings.Join(hosts, ",") + "/0"
		if kind == "quorum" {
			s.url = "quorum:?" + strings.Join(nodes, "&")
		}
	case "etcd", "zk":
		n := 1
		if slices.Contains(c.Faults, FaultKillLeader) {
			n = 3
		}
		if kind == "etcd" {
			s.cluster, err = testserver.StartEtcd(n)
		} else {
			s.cluster, err = testserver.StartZooKeeperWith(n, &testserver.ZooKeeperOptions{Faketime: s.faketime})
		}
		if err == nil {
			s.members = s.cluster.Members
			param := "session_ttl"
			if kind == "zk" {
				param = "session_timeout"
			}
			s.url = s.cluster.URL() + "?" + param + "=" + c.TTL.String()
		}
	case "redis-sentinel":
		err = s.startSentinel(c.TTL)
	case "postgres", "mysql":
		var m *testserver.Server
		if kind == "postgres" {
			m, err = testserver.StartPostgres(&testserver.SQLOptions{Faketime: s.faketime})
		} else {
			m, err = testserver.StartMariaDB(&testserver.SQLOptions{Faketime: s.faketime})
		}
		if err == nil {
			s.members = []*testserver.Server{m}
			sep := "?"
			if strings.Contains(m.URL(), "?") {
				sep = "&"
			}
			s.url = m.URL() + sep + "mode=" + mode
		}
	}
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("check: spawn %s: %w", backend, err) // wraps testserver.ErrNotInstalled when a program is missing
	}
	return s, nil
}

// Backend returns the backend the servers serve, as Config.Spawn names it.
func (s *Servers) Backend() string {
	if s.mode != "" {
		return s.kind + "/" + s.mode
	}
	return s.kind
}

// Stop stops every server and removes their files. It is idempotent.
func (s *Servers) Stop() {
	if s.sentinel != nil {
		s.sentinel.Stop()
	} else if s.cluster != nil {
		s.cluster.Stop()
	} else {
		for _, m := range s.members {
			m.Stop()
		}
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// member returns a server to hit: the leader of a cluster (or of redlock
// and quorum, the first node), else the only server.
func (s *Servers) member() (int, *testserver.Server, error) {
	if len(s.members) == 0 {
		return 0, nil, errors.New("no server to hit")
	}
	if s.cluster != nil && len(s.members) > 1 {
		i, err := s.cluster.Leader()
		if err != nil {
			return 0, nil, err
		}
		return i, s.members[i], nil
	}
	return 0, s.members[0], nil
}
