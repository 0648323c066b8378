package dlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memlock"
)

// quiescing is a memlock driver that implements driver.Quiescer.
type quiescing struct {
	*memlock.Driver
	err               error
	quiesced, resumed int
}

func (q *quiescing) Quiesce(ctx context.Context) (func(), error) {
	q.quiesced++
	if q.err != nil {
		return nil, q.err
	}
	return func() { q.resumed++ }, nil
}

// TestQuiesce: Client.Quiesce is the driver's when it implements
// driver.Quiescer (its resume, its error), and otherwise returns at once
// with a resume that does nothing.
func TestQuiesce(t *testing.T) {
	ctx := context.Background()
	q := &quiescing{Driver: memlock.NewBackend().NewDriver()}
	c := dlock.New(q, nil)
	defer c.Close()
	resume, err := c.Quiesce(ctx)
	if err != nil || resume == nil {
		t.Fatalf("Quiesce = %v (resume nil: %v), want the driver's resume", err, resume == nil)
	}
	if q.quiesced != 1 || q.resumed != 0 {
		t.Fatalf("driver quiesced %d times, resumed %d; want 1, 0", q.quiesced, q.resumed)
	}
	resume()
	if q.resumed != 1 {
		t.Fatalf("driver resumed %d times, want 1", q.resumed)
	}
	q.err = errors.New("still running")
	if resume, err := c.Quiesce(ctx); !errors.Is(err, q.err) || resume != nil {
		t.Fatalf("Quiesce = %v (resume nil: %v), want the driver's error and no resume", err, resume == nil)
	}

	plain, _ := newMem(t, nil)
	resume, err = plain.Quiesce(ctx)
	if err != nil || resume == nil {
		t.Fatalf("Quiesce on a driver without Quiescer = %v (resume nil: %v), want a no-op resume", err, resume == nil)
	}
	resume()
	l, err := plain.NewMutex("a", nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after Quiesce and resume: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
