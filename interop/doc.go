// Package interop holds dlock's tests against foreign lock clients that
// must never become dependencies of the dlock module: redsync,
// bsm/redislock, redis-py and a Python client of dlock's own Redis layout
// written from docs/protocol.md. It is its own Go module (a replace points
// at the dlock module in ../); `make test` runs it.
package interop
