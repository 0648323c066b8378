//go:build !unix

package dlock_test

import "time"

// cpuTime cannot read the process's CPU time on this platform.
func cpuTime() (time.Duration, bool) { return 0, false }
