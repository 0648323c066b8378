package quorum

import (
	"context"
	"fmt"
	"sync"
	"time"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// lazyRetry is how long a node that could not be opened is left alone
// before the next call tries to open it again.
const lazyRetry = time.Second

// lazyNode is a node of a quorum: URL that was down when the driver opened:
// it counts as a failing node until a call manages to open it (at most once
// per lazyRetry), and from then on is that driver.
type lazyNode struct {
	raw  string
	name string

	mu      sync.Mutex
	d       driver.Driver
	opening bool
	closed  bool
	lastTry time.Time
	lastErr error
}

var (
	_ driver.Driver      = (*lazyNode)(nil)
	_ driver.FenceRaiser = (*lazyNode)(nil)
	_ driver.Notifier    = (*lazyNode)(nil)
	_ driver.Inspector   = (*lazyNode)(nil)
	_ driver.NameChecker = (*lazyNode)(nil)
)

func newLazyNode(raw, name string, err error) *lazyNode {
	return &lazyNode{raw: raw, name: name, lastTry: time.Now(), lastErr: err}
}

// get returns the node's driver, opening it if it is time to try again.
func (l *lazyNode) get(ctx context.Context) (driver.Driver, error) {
	l.mu.Lock()
	if l.d != nil || l.closed || l.opening || time.Since(l.lastTry) < lazyRetry {
		d, err := l.d, l.lastErr
		if l.closed {
			err = fmt.Errorf("not open: %w", dlock.ErrClosed)
		}
		l.mu.Unlock()
		if d != nil {
			return d, nil
		}
		return nil, fmt.Errorf("could not be opened (retried every %v): %w", lazyRetry, err)
	}
	l.opening = true
	l.mu.Unlock()
	d, err := dlock.OpenDriver(ctx, l.raw)
	if err == nil {
		if _, ok := d.(driver.FenceRaiser); !ok {
			_ = d.Close()
			d, err = nil, fmt.Errorf("its driver cannot raise its fencing counter: %w", driver.ErrUnsupported)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.opening, l.lastTry, l.lastErr = false, time.Now(), err
	if err != nil {
		return nil, fmt.Errorf("could not be opened: %w", err)
	}
	if l.closed {
		_ = d.Close()
		return nil, fmt.Errorf("not open: %w", dlock.ErrClosed)
	}
	l.d = d
	return d, nil
}

func (l *lazyNode) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d, err := l.get(ctx)
	if err != nil {
		return driver.Grant{}, err
	}
	return d.TryAcquire(ctx, req)
}

func (l *lazyNode) Release(ctx context.Context, dl driver.Lease) (int, error) {
	d, err := l.get(ctx)
	if err != nil {
		return 0, err
	}
	return d.Release(ctx, dl)
}

func (l *lazyNode) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return d.Renew(ctx, ls)
}

func (l *lazyNode) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	return d.(driver.FenceRaiser).RaiseFence(ctx, name, k, atLeast)
}

func (l *lazyNode) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	n, ok := d.(driver.Notifier)
	if !ok {
		return nil, fmt.Errorf("does not notify: %w", driver.ErrUnsupported)
	}
	return n.Subscribe(ctx, name)
}

func (l *lazyNode) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	in, ok := d.(driver.Inspector)
	if !ok {
		return nil, fmt.Errorf("cannot list locks: %w", driver.ErrUnsupported)
	}
	return in.Inspect(ctx, prefix)
}

// CheckName applies the node's rules once it is open.
func (l *lazyNode) CheckName(name string) error {
	l.mu.Lock()
	d := l.d
	l.mu.Unlock()
	if nc, ok := d.(driver.NameChecker); ok {
		return nc.CheckName(name)
	}
	return nil
}

func (l *lazyNode) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.d != nil {
		return l.d.Close()
	}
	return nil
}
