package check

// The checker's workers reach every backend dlock has a driver for.
import (
	_ "github.com/dlock/dlock/etcdlock"
	_ "github.com/dlock/dlock/memlock"
	_ "github.com/dlock/dlock/mysqllock"
	_ "github.com/dlock/dlock/pglock"
	_ "github.com/dlock/dlock/quorum"
	_ "github.com/dlock/dlock/redislock"
	_ "github.com/dlock/dlock/redlock"
	_ "github.com/dlock/dlock/sqlitelock"
	_ "github.com/dlock/dlock/zklock"
)
