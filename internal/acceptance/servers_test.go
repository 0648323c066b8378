package acceptance

import (
	"strings"
	"testing"
	"time"

	_ "github.com/dlock/dlock/etcdlock"
	"github.com/dlock/dlock/internal/testserver"
	_ "github.com/dlock/dlock/mysqllock"
	_ "github.com/dlock/dlock/pglock"
	_ "github.com/dlock/dlock/redislock"
	_ "github.com/dlock/dlock/redlock"
	_ "github.com/dlock/dlock/zklock"
)

func TestRedis(t *testing.T) {
	t.Parallel()
	s := testserver.Redis(t, nil)
	runScenarios(t, backend{url: s.URL(), ttl: time.Second})
}

func TestRedlock(t *testing.T) {
	t.Parallel()
	ss := testserver.RedisN(t, 3, nil)
	addrs := make([]string, len(ss))
	for i, s := range ss {
		addrs[i] = s.Addr()
	}
	runScenarios(t, backend{url: "redlock://" + strings.Join(addrs, ","), ttl: time.Second})
}

func TestEtcd(t *testing.T) {
	t.Parallel()
	c := testserver.Etcd(t, 1)
	runScenarios(t, backend{url: c.URL() + "/dlock-acceptance/?session_ttl=2s", ttl: 2 * time.Second, sessionTTL: true})
}

func TestZooKeeper(t *testing.T) {
	t.Parallel()
	c := testserver.ZooKeeper(t, 1)
	runScenarios(t, backend{url: c.URL() + "/dlock-acceptance?session_timeout=2s", ttl: 2 * time.Second, sessionTTL: true})
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	s := testserver.Postgres(t)
	for _, mode := range []string{"lease", "advisory", "rowlock"} {
		t.Run(mode, func(t *testing.T) {
			runScenarios(t, backend{url: withParam(s.URL(), "mode", mode), ttl: time.Second, sessionTTL: mode != "lease", freedOnDisconnect: mode != "lease"})
		})
	}
}

func TestMySQL(t *testing.T) {
	t.Parallel()
	s := testserver.MariaDB(t)
	for _, mode := range []string{"lease", "getlock", "rowlock"} {
		t.Run(mode, func(t *testing.T) {
			runScenarios(t, backend{url: withParam(s.URL(), "mode", mode), ttl: time.Second, sessionTTL: mode != "lease", freedOnDisconnect: mode != "lease"})
		})
	}
}

func withParam(u, k, v string) string {
	if strings.Contains(u, "?") {
		return u + "&" + k + "=" + v
	}
	return u + "?" + k + "=" + v
}
