//go:build race

package quorum_test

// raceEnabled reports a -race build, in which SQLite runs some 30 times
// slower.
const raceEnabled = true
