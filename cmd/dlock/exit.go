package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dlock/dlock"
)

// Exit codes of dlock itself, after sysexits.h where one fits. "dlock run"
// otherwise exits with its child's code (128+N if the child died of signal
// N). They are documented in docs/cli.md and "dlock run --help"; changing
// one breaks scripts.
const (
	exitOK          = 0
	exitUsage       = 64  // bad flag, argument, lock name or URL (EX_USAGE)
	exitUnavailable = 69  // backend unreachable or failing; inspection unsupported (EX_UNAVAILABLE)
	exitInternal    = 70  // a bug in dlock (EX_SOFTWARE)
	exitNotAcquired = 75  // lock not acquired: --no-wait, or --wait ran out (EX_TEMPFAIL)
	exitLeaseLost   = 76  // the lease was lost while the child ran; the child was stopped
	exitCannotExec  = 126 // the command was found but could not be started
	exitNotFound    = 127 // the command was not found
)

// exitError is an error that decides dlock's exit code. A nil err with a
// code means "exit quietly with this code" (the child's own status).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitf(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// usageErr marks err as bad input (exit 64).
func usageErr(err error) error { return &exitError{code: exitUsage, err: err} }

// classify maps a library error to an exit code: bad input 64, lock held
// 75, anything else from the backend 69 (a timeout there included).
func classify(err error) int {
	switch {
	case errors.Is(err, dlock.ErrInvalid):
		return exitUsage
	case errors.Is(err, dlock.ErrLocked):
		return exitNotAcquired
	default:
		return exitUnavailable
	}
}

// message formats err for stderr on one line, prefixed "dlock: " once: the
// library prefixes each error it wraps ("dlock: trylock "x": dlock: lock is
// held"), which says the same thing twice.
func message(err error) string {
	s := strings.TrimPrefix(err.Error(), "dlock: ")
	s = strings.ReplaceAll(s, ": dlock: ", ": ")
	s = strings.ReplaceAll(s, "\n", " ")
	return "dlock: " + s
}
