//go:build race

package sqlitelock

// raceEnabled reports a -race build, in which SQLite (Go translated from C,
// every pointer operation checked) runs some 30 times slower.
const raceEnabled = true
