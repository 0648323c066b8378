package sqlcommon

import "time"

// SharedTimer is one runtime timer serving many deadlines: its owner lists
// them (oldest first, or in a heap) and arms the timer for the earliest only
// when it is not armed already, or when a new deadline comes before the one
// it is armed for; the timer is left armed when a deadline is dropped, and
// when it fires the owner takes what is due and arms it for the next. A
// stream of short-lived deadlines so arms it about once per deadline span
// instead of once per deadline: arming a timer due before the Go netpoller's
// current sleep wakes the poller (an eventfd write and a thread wake-up), a
// measurable cost per operation on a small machine.
//
// It is not safe for concurrent use: its owner's lock guards it, and the
// function given to Arm runs without that lock, on the timer's goroutine.
// The zero value is ready to use.
type SharedTimer struct {
	timer *time.Timer
	armed bool
	arms  int // how many times it was armed, for tests
}

// Arm sets the timer to run fire after d (fire must be the same function on
// every call).
func (t *SharedTimer) Arm(d time.Duration, fire func()) {
	t.armed = true
	t.arms++
	if t.timer == nil {
		t.timer = time.AfterFunc(d, fire)
	} else {
		t.timer.Reset(d)
	}
}

// Armed reports whether the timer is set to fire.
func (t *SharedTimer) Armed() bool { return t.armed }

// Fired records that the timer fired; its fire function calls it (under the
// owner's lock) before arming it again.
func (t *SharedTimer) Fired() { t.armed = false }

// Stop stops the timer if it is armed.
func (t *SharedTimer) Stop() {
	if t.timer != nil {
		t.timer.Stop()
	}
	t.armed = false
}

// Arms reports how many times the timer was armed (for tests).
func (t *SharedTimer) Arms() int { return t.arms }
