package pglock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// growth keeps the planner's picture of the driver's tables in step with
// their size. The driver's statements are prepared once per connection, and
// after five runs PostgreSQL may keep one generic plan for each. A plan made
// while a table's statistics say it is one page (a new table that
// autovacuum analyzed with a dozen rows in it) reads the table sequentially,
// since that is cheaper than the primary key at that size, and keeps doing
// so as the table grows, until statistics change again: with 10,000 rows
// every acquire and release then scans all of them (≈0.7 ms per statement;
// a whole Lock+Unlock by primary key takes ≈0.15 ms), for up to a minute
// (autovacuum's naptime) or longer. So the driver counts the rows it adds
// to each table it looks rows up in by key, and, when a table's count
// reaches 64, 128, 256 and each next power of two, has that table analyzed
// in the background: ANALYZE updates the statistics and makes every session
// plan its statements on the table afresh (by primary key). That is log₂
// of the rows added, about ten ANALYZEs for a table grown to 100,000 names,
// each of a sample (at most 30,000 rows). Without the privilege to analyze
// (only the owner may) PostgreSQL skips it with a warning; nothing fails.
//
// The rows counted: in the lock table, a lease-mode grant of a name whose
// row was missing; in <table>_rowlock, a row a ModeRowLock acquire
// inserted; in <table>_kinds, a lease-mode read/write lock or semaphore
// whose state row was new (or never granted); in <table>_holders, a
// lease-mode hold put there for an owner that had none (its rows go with
// their holds, so that count is of holds taken: an ANALYZE per doubling of
// them, whatever the table's size). ModeAdvisory needs none: its inserts
// (ON CONFLICT) always go by the index, and the only rows it looks up by
// key, waiting writers' marks in <table>_holders, are only ever a few.
type growth struct {
	lock, rowlock, kinds, holders grower

	wg   sync.WaitGroup
	ctx  context.Context // cancelled by stop
	stop context.CancelFunc
}

// grower is one table's count of added rows and the statement that
// analyzes it.
type grower struct {
	added   atomic.Int64
	analyze string
}

// firstAnalyze is the count of added rows at which a table is first
// analyzed; it is analyzed again each time the count doubles.
const firstAnalyze = 64

// analyzeTimeout bounds one background ANALYZE.
const analyzeTimeout = 30 * time.Second

func newGrowth(table string) *growth {
	ctx, cancel := context.WithCancel(context.Background())
	g := &growth{ctx: ctx, stop: cancel}
	g.lock.analyze = "ANALYZE " + table
	g.rowlock.analyze = "ANALYZE " + table + "_rowlock"
	g.kinds.analyze = "ANALYZE " + table + "_kinds"
	g.holders.analyze = "ANALYZE " + table + "_holders"
	return g
}

// rowAdded counts one row added to t's table (one of s.grown's), starting
// an ANALYZE of it when the count reaches a threshold.
func (s *store) rowAdded(t *grower) {
	g := s.grown
	n := t.added.Add(1)
	if n < firstAnalyze || n&(n-1) != 0 {
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		ctx, cancel := context.WithTimeout(g.ctx, analyzeTimeout)
		defer cancel()
		if _, err := s.pool.Exec(ctx, t.analyze); err != nil && ctx.Err() == nil {
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
