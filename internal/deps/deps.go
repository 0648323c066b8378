//go:build tools

// Package deps pins the modules the backends use, so that go.mod lists them
// before their packages are written.
package deps

import (
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/go-zookeeper/zk"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/spf13/cobra"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/client/v3/concurrency"
	_ "go.uber.org/goleak"
	_ "modernc.org/sqlite"
)
