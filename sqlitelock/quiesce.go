package sqlitelock

import (
	"context"
	"fmt"
	"sync"

	"github.com/dlock/dlock/driver"
)

var _ driver.Quiescer = (*Driver)(nil)

// gate counts the driver's running statements and, while the driver is
// quiesced, holds new ones back. Every statement (or transaction) the
// driver runs on the database does so between enter and leave, inside one
// retryBusy attempt, and none of them enters the gate twice, so a Quiesce
// waiting for the running ones to leave cannot deadlock with them.
type gate struct {
	mu      sync.Mutex
	running int
	waiting int           // statements held back by shut (for tests)
	shut    chan struct{} // non-nil while quiescing or quiesced; closed by resume
	idle    chan struct{} // closed when running drops to 0 while shut
}

// enter waits until the driver is not quiesced, or ctx ends, and counts a
// running statement.
func (g *gate) enter(ctx context.Context) error {
	g.mu.Lock()
	for g.shut != nil {
		shut := g.shut
		g.waiting++
		g.mu.Unlock()
		var err error
		select {
		case <-shut:
		case <-ctx.Done():
			err = ctx.Err()
		}
		g.mu.Lock()
		g.waiting--
		if err != nil {
			g.mu.Unlock()
			return err
		}
	}
	g.running++
	g.mu.Unlock()
	return nil
}

// leave ends what enter began.
func (g *gate) leave() {
	g.mu.Lock()
	g.running--
	if g.running == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

// quiesce shuts the gate and waits for the running statements to leave.
func (g *gate) quiesce(ctx context.Context) (resume func(), err error) {
	g.mu.Lock()
	for g.shut != nil { // another Quiesce: wait for its resume
		shut := g.shut
		g.mu.Unlock()
		select {
		case <-shut:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		g.mu.Lock()
	}
	shut := make(chan struct{})
	g.shut = shut
	var idle chan struct{}
	if g.running > 0 {
		idle = make(chan struct{})
		g.idle = idle
	}
	g.mu.Unlock()
	var once sync.Once
	resume = func() {
		once.Do(func() {
			g.mu.Lock()
			g.shut, g.idle = nil, nil
			close(shut)
			g.mu.Unlock()
		})
	}
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			resume()
			return nil, ctx.Err()
		}
	}
	return resume, nil
}

// Quiesce implements driver.Quiescer. It holds back every new statement
// on the database and waits, until ctx ends, for the running ones to
// finish, so that no write transaction, and so no write lock on the file,
// is left open while the process is stopped. A statement waiting for
// another process's write lock (for up to the busy timeout) counts as
// running. Leases are not renewed until resume; waits and other calls
// made meanwhile block until resume or their own context's end. After
// Close, Quiesce returns an error.
func (d *Driver) Quiesce(ctx context.Context) (resume func(), err error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	resume, err = d.gate.quiesce(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlitelock: quiesce: statements still running: %w", err)
	}
	return resume, nil
}
