package locktest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/dlock/dlock"
)

// TestTimedOut: the errors tryUntil tries again after are timeouts, as the
// drivers wrap them (a quorum's "N of M nodes failed: node i: ...: i/o
// timeout", a node's "no answer within the node timeout"); a refusal that
// is not ErrLocked, a closed client or a bare message are not.
func TestTimedOut(t *testing.T) {
	ioTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("dlock: trylock: quorum: acquire: 3 of 5 nodes failed: node 1: redislock: acquire: %w", ioTimeout), true},
		{fmt.Errorf("quorum: acquire: 3 of 5 nodes failed: node 0: no answer within the 400ms node timeout: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("trylock: %w", dlock.ErrLocked), false},
		{fmt.Errorf("trylock: %w", dlock.ErrClosed), false},
		{fmt.Errorf("trylock: %w", context.Canceled), false},
		{errors.New("read tcp: i/o timeout"), false},
	} {
		if got := timedOut(c.err); got != c.want {
			t.Errorf("timedOut(%q) = %v, want %v", c.err, got, c.want)
		}
	}
}
