package check

import (
	"time"

	"golang.org/x/sys/unix"
)

// mono reads CLOCK_MONOTONIC in nanoseconds. Unlike Go's own monotonic
// readings, which are private to a process, this clock is the machine's, so
// events of different worker processes compare directly.
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("check: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// stamp returns an Event of kind k stamped with both clocks.
func stamp(k Kind) Event {
	return Event{Kind: k, Mono: mono(), Wall: time.Now()}
}
