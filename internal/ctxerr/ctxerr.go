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
)

// Wrap returns err prefixed with what ("what: err"). When ctx is done and
// err does not already wrap ctx.Err(), the result wraps both ctx.Err() and
// err ("what: context deadline exceeded: err"), so that errors.Is finds the
// context's error as well as every error err wraps. Wrap(ctx, what, nil) is
// nil.
func Wrap(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%s: %w: %w", what, cerr, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
