package ctxerr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/internal/ctxerr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pastDeadline is a context whose deadline has passed while its Err is
// still nil, as a real one's is until its timer fires.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
func (pastDeadline) Err() error                  { return nil }
func (pastDeadline) Done() <-chan struct{}       { return nil }
func (pastDeadline) Value(any) any               { return nil }

func TestWrap(t *testing.T) {
	ioTimeout := errors.New("i/o timeout")
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
		is   []error
		not  []error
	}{
		{"live context", live, ioTimeout, "redislock: renew: i/o timeout", []error{ioTimeout}, []error{context.Canceled}},
		{"ended context", cancelled, ioTimeout, "redislock: renew: context canceled: i/o timeout", []error{ioTimeout, context.Canceled}, nil},
		{"deadline passed, timer not yet fired", pastDeadline{}, ioTimeout, "redislock: renew: context deadline exceeded: i/o timeout", []error{ioTimeout, context.DeadlineExceeded}, nil},
		{"already wraps it", cancelled, fmt.Errorf("dial: %w", context.Canceled), "redislock: renew: dial: context canceled", []error{context.Canceled}, nil},
	} {
		got := ctxerr.Wrap(c.ctx, "redislock: renew", c.err)
		if got.Error() != c.want {
			t.Errorf("%s: Wrap = %q, want %q", c.name, got, c.want)
		}
		for _, e := range c.is {
			if !errors.Is(got, e) {
				t.Errorf("%s: Wrap = %v does not wrap %v", c.name, got, e)
			}
		}
		for _, e := range c.not {
			if errors.Is(got, e) {
				t.Errorf("%s: Wrap = %v wraps %v", c.name, got, e)
			}
		}
	}
	if err := ctxerr.Wrap(cancelled, "x", nil); err != nil {
		t.Fatalf("Wrap(nil) = %v, want nil", err)
	}
}
