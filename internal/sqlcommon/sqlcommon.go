// Package sqlcommon holds what pglock and mysqllock share: table-name
// validation, credential redaction, the error shapes a session-bound grant
// reports when its connection dies, and the bookkeeping of session-bound
// locks (Sessions) over a driver's own pinned-connection type.
package sqlcommon

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
)

// DefaultTable is the lock table's name when Options.Table is empty.
const DefaultTable = "dlock_locks"

// MaxTableLen leaves room for the suffixes the drivers append to the table
// name (for example "_rowlock", "_release") within PostgreSQL's 63-byte
// identifier limit.
const MaxTableLen = 48

// CheckTable reports whether name is usable as an unquoted table name on both
// databases: an ASCII letter or underscore, then letters, digits or
// underscores, at most MaxTableLen bytes. Nothing else is ever spliced into
// SQL text.
func CheckTable(name string) error {
	if name == "" {
		return errors.New("table name is empty")
	}
	if len(name) > MaxTableLen {
		return fmt.Errorf("table name %q is longer than %d bytes", name, MaxTableLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return fmt.Errorf("table name %q must match [A-Za-z_][A-Za-z0-9_]*", name)
		}
	}
	return nil
}

// Redact returns err with every occurrence of the URL's password (raw and
// escaped) replaced by "xxxxx". It keeps err in the chain for errors.Is.
func Redact(err error, u *url.URL) error {
	if err == nil || u == nil || u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		return err
	}
	msg := err.Error()
	red := msg
	for _, s := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw), url.UserPassword("x", pw).String()[2:]} {
		if s != "" {
			red = strings.ReplaceAll(red, s, "xxxxx")
		}
	}
	if red == msg {
		return err
	}
	return &redacted{msg: red, err: err}
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// SessionLost returns the error a session-bound grant reports once its pinned
// connection is gone: it wraps both driver.ErrSessionLost and
// driver.ErrNotHeld, and cause when there is one.
func SessionLost(cause error) error {
	if cause == nil {
		return fmt.Errorf("%w: pinned connection closed: %w", driver.ErrSessionLost, driver.ErrNotHeld)
	}
	return fmt.Errorf("%w: pinned connection failed (%v): %w", driver.ErrSessionLost, cause, driver.ErrNotHeld)
}

// ErrKilled is returned by every call on a driver after the test harness has
// simulated its process's crash.
var ErrKilled = errors.New("driver was killed (simulated crash)")

// Micros converts d to whole microseconds, rounding up so that a positive
// duration never becomes zero.
func Micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Unsupported reports a LockDelay request to a session-bound mode.
func Unsupported(mode string) error {
	return fmt.Errorf("%w: lock-delay in mode %s (a session lock ends with its connection)", driver.ErrUnsupported, mode)
}

// Lost is a once-closed loss signal for a session-bound grant: the channel
// behind driver.Grant.Lost and the error behind driver.Grant.Cause.
// The zero value is not usable; use NewLost.
type Lost struct {
	ch    chan struct{}
	once  chan struct{} // 1-buffered token: whoever takes it closes ch
	cause error
}

// NewLost returns an open loss signal.
func NewLost() *Lost {
	l := &Lost{ch: make(chan struct{}), once: make(chan struct{}, 1)}
	l.once <- struct{}{}
	return l
}

// Close records cause and closes the channel. Only the first call has an
// effect. It is safe for concurrent use.
func (l *Lost) Close(cause error) {
	select {
	case <-l.once:
		l.cause = cause
		close(l.ch)
	default:
	}
}

// C is closed by the first Close.
func (l *Lost) C() <-chan struct{} { return l.ch }

// Cause returns the error given to Close, or nil while l is open.
func (l *Lost) Cause() error {
	select {
	case <-l.ch:
		return l.cause
	default:
		return nil
	}
}
