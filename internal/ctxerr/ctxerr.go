// Package ctxerr is the one helper the drivers use to describe a failed
// backend call whose context may have ended meanwhile. Client libraries
// report a missed deadline or a cancelled request in their own words (an i/o
// timeout, an interrupted statement, a closed connection); the dlock package
// must still be able to tell "the caller's context ended" (not worth a retry)
// from "the backend failed" (worth one), with errors.Is.
package ctxerr

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Wrap returns err prefixed with what ("what: err"). When ctx is done and
// err does not already wrap ctx.Err(), the result wraps both ctx.Err() and
// err ("what: context deadline exceeded: err"), so that errors.Is finds the
// context's error as well as every error err wraps. A context whose
// deadline has passed counts as done with context.DeadlineExceeded even
// before its timer has fired: a client library that sets its socket
// deadlines from ctx's (go-redis) fails the call at the deadline, and
// ctx.Err() can still be nil a moment later. Wrap(ctx, what, nil) is nil.
func Wrap(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, With(ctx, err))
}

// With is Wrap without the prefix: err itself, or, when ctx is done (its
// deadline passed counts) and err does not already wrap ctx's error, both
// ("context deadline exceeded: err"). With(ctx, nil) is nil.
func With(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return err
}
