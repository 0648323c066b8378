package ctxerr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/internal/ctxerr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
