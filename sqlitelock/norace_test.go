//go:build !race

package sqlitelock

const raceEnabled = false
