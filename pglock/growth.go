package pglock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// growth keeps the planner's picture of the lock table in step with its
// size. The driver's statements are prepared once per connection, and after
// five runs PostgreSQL may keep one generic plan for each. A plan made while
// the table's statistics say it is one page (a new table that autovacuum
// analyzed with a dozen rows in it) reads the table sequentially, since that
// is cheaper than the primary key at that size, and keeps doing so as the
// table grows, until statistics change again: with 10,000 rows every
// acquire and release then scans all of them (≈0.7 ms per statement;
// a whole Lock+Unlock by primary key takes ≈0.15 ms),
// for up to a minute (autovacuum's naptime) or longer. So the driver counts
// the rows it adds (lease mode: a grant of a name whose row was missing)
// and, when the count reaches 64, 128, 256 and each next power of two, has
// the table analyzed in the background: ANALYZE updates the statistics and
// makes every session plan its statements on the table afresh (by primary
// key). That is log₂ of the rows added, about ten ANALYZEs for a table
// grown to 100,000 names, each of a sample (at most 30,000 rows). Without
// the privilege to analyze (only the owner may) PostgreSQL skips it with a
// warning; nothing fails.
type growth struct {
	added atomic.Int64
	wg    sync.WaitGroup
	ctx   context.Context // cancelled by stop
	stop  context.CancelFunc
}

// firstAnalyze is the count of added rows at which the table is first
// analyzed; it is analyzed again each time the count doubles.
const firstAnalyze = 64

// analyzeTimeout bounds one background ANALYZE.
const analyzeTimeout = 30 * time.Second

func newGrowth() *growth {
	ctx, cancel := context.WithCancel(context.Background())
	return &growth{ctx: ctx, stop: cancel}
}

// rowAdded counts one row added to the table, starting an ANALYZE of it when
// the count reaches a threshold.
func (s *store) rowAdded() {
	g := s.grown
	n := g.added.Add(1)
	if n < firstAnalyze || n&(n-1) != 0 {
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		ctx, cancel := context.WithTimeout(g.ctx, analyzeTimeout)
		defer cancel()
		if _, err := s.pool.Exec(ctx, s.q.analyze); err != nil && ctx.Err() == nil {
			analyzeErrs.Add(1)
		}
	}()
}

// analyzeErrs counts ANALYZEs that failed (not for want of privilege, which
// PostgreSQL reports as a warning): only for tests and debugging.
var analyzeErrs atomic.Int64

// close stops a running ANALYZE and waits for it; the pool must still be
// open.
func (g *growth) close() {
	g.stop()
	g.wg.Wait()
}
