package dlock

import "time"

// Clock is the time source a Client uses to measure lease validity and to
// schedule renewals and waits. Implementations must be safe for concurrent
// use. Durations between two Now readings must be measured on a monotonic
// clock; wall-clock jumps must not shorten or stretch them.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that sends on C after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable timer from a Clock. C is nil for AfterFunc timers.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock returns the clock of the time package (monotonic readings).
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer {
	return sysTimer{time.AfterFunc(d, f)}
}

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time        { return t.t.C }
func (t sysTimer) Stop() bool                 { return t.t.Stop() }
func (t sysTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
