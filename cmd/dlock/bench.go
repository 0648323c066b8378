package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/bench/floor"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/locktest"
	"github.com/spf13/cobra"
)

var benchLong = `Bench measures dlock against one backend (--url or --url-file, else $DLOCK_URL
or $DLOCK_URL_FILE, else the default SQLite file) with the measurements of
the locktest package:

  uncontended   Lock+Unlock of a free lock, interleaved with the backend's
                raw floor (its bare primitives on one connection, e.g. SET NX
                PX + a scripted delete) and one bare round trip
  hot lock      --goroutines goroutines over 4 clients taking one lock:
                hand-off latency (release → next grant), throughput, and how
                often the previous holder took the lock again
  wake-up       release → grant of one blocked waiter on another client
  fairness      9 goroutines over 3 clients (as 3 processes would be), each
                taking the lock, holding it (100ms at the default duration)
                and coming back: how long a Lock waits (median, 99th
                percentile, longest) and the fewest grants any goroutine got
  many held     Lock+Unlock with 0 and with --held leases held by the client,
                the time to take them and the heap per lease (a mode that
                pins a connection per lock stops at its pool's size, noted
                under the table)

The run takes about --duration (default 20s; the many-held scenario adds the
time it takes to acquire the leases), with a progress line on stderr. The
machine's noise matters: compare ratios and medians of runs on one machine.

Exit codes: 0 done; 64 bad flag or URL; 69 the backend failed or could not
be reached.`

// benchFlags are the settings of one "dlock bench".
type benchFlags struct {
	url        urlFlags
	duration   time.Duration
	goroutines int
	held       int
	asJSON     bool
}

func newBenchCmd(e *env) *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Measure lock latency, hand-off, wake-up and cost of held leases on a backend",
		Long:  benchLong,
		Example: `  dlock bench
  dlock bench --url redis://127.0.0.1:6379/0 --duration 10s
  dlock bench --url etcd://127.0.0.1:2379 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBench(cmd, e, f)
		},
	}
	fl := cmd.Flags()
	f.url.register(cmd, defaultURLHelp)
	fl.DurationVar(&f.duration, "duration", 20*time.Second, "about how long the measurements run")
	fl.IntVar(&f.goroutines, "goroutines", 8, "goroutines contending in the hot-lock scenario")
	fl.IntVar(&f.held, "held", 1000, "leases held in the many-held scenario")
	fl.BoolVar(&f.asJSON, "json", false, "print the results as JSON instead of the table")
	return cmd
}

// benchReport is the result of one "dlock bench", as printed with --json.
// Durations are in nanoseconds.
type benchReport struct {
	URL         string         `json:"url"`
	Floor       string         `json:"floor,omitempty"`
	Uncontended locktest.Stats `json:"uncontended"`
	FloorStats  locktest.Stats `json:"floor_uncontended"`
	XFloor      float64        `json:"x_floor,omitempty"`
	RoundTrip   locktest.Stats `json:"round_trip"`
	Hot         struct {
		Goroutines  int            `json:"goroutines"`
		Handoff     locktest.Stats `json:"handoff"`
		OpsPerSec   float64        `json:"ops_per_sec"`
		RetakeShare float64        `json:"retake_share"`
	} `json:"hot_lock"`
	Wake locktest.Stats `json:"wake"`
	Fair struct {
		Contenders  int            `json:"contenders"`
		Hold        time.Duration  `json:"hold_ns"`
		Wait        locktest.Stats `json:"wait"`
		MaxWait     time.Duration  `json:"max_wait_ns"`
		MinGrants   int            `json:"min_grants"`
		RetakeShare float64        `json:"retake_share"`
	} `json:"fairness"`
	Held struct {
		Levels          []locktest.HeldLevel `json:"levels"`
		Ratio           float64              `json:"ratio"`
		AcquirePerLease time.Duration        `json:"acquire_per_lease_ns"`
		BytesPerLease   float64              `json:"bytes_per_lease"`
		// Error says why fewer leases than asked for were held.
		Error string `json:"error,omitempty"`
	} `json:"many_held"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

func runBench(cmd *cobra.Command, e *env, f *benchFlags) error {
	switch {
	case f.duration <= 0:
		return usageErr(fmt.Errorf("bench: --duration must be positive, got %v", f.duration))
	case f.goroutines < 2:
		return usageErr(fmt.Errorf("bench: --goroutines must be at least 2, got %d", f.goroutines))
	case f.held < 0:
		return usageErr(fmt.Errorf("bench: --held must not be negative, got %d", f.held))
	}
	raw, err := f.url.backendURL(e, "bench")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := &progress{w: cmd.ErrOrStderr(), e: e, start: time.Now(), total: f.duration}
	rep, err := benchmark(ctx, raw, f, p)
	p.done()
	if err != nil {
		if errors.Is(err, dlock.ErrInvalid) {
			return usageErr(err)
		}
		return &exitError{code: exitUnavailable, err: err}
	}
	var out strings.Builder
	if f.asJSON {
		enc := json.NewEncoder(&out)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = writeBenchTable(&out, rep)
	}
	if err == nil {
		_, err = io.WriteString(cmd.OutOrStdout(), e.scrub(out.String()))
	}
	if err != nil {
		return &exitError{code: exitUnavailable, err: err}
	}
	return nil
}

// benchmark runs the scenarios in turn, each within its share of
// f.duration.
func benchmark(ctx context.Context, raw string, f *benchFlags, p *progress) (*benchReport, error) {
	share := func(pct int) locktest.Budget { return locktest.Budget{Duration: f.duration * time.Duration(pct) / 100} }
	rep := &benchReport{URL: raw}
	if u, err := url.Parse(raw); err == nil {
		rep.URL = openurl.RedactURL(u)
	}
	// Clients: 0 measures uncontended, 0..3 share the hot lock, 1 waits in
	// the wake-up scenario, 4 holds many leases.
	var cs []*dlock.Client
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	p.set("connecting")
	for range 5 {
		c, err := dlock.Open(ctx, raw)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		cs = append(cs, c)
	}
	name := fmt.Sprintf("dlock-bench-%d", time.Now().UnixNano())
	once := func(c *dlock.Client, lockName string) func(context.Context) error {
		lock := locktest.MutexLocker(c.NewMutex(lockName, nil))
		return func(ctx context.Context) error {
			unlock, err := lock(ctx)
			if err != nil {
				return err
			}
			return unlock(ctx)
		}
	}

	ops := []func(context.Context) error{once(cs[0], name+"-unc")}
	fl, err := floor.Open(ctx, raw)
	if err == nil {
		defer fl.Close()
		rep.Floor = fl.Desc
		key := name + "-floor"
		ops = append(ops, func(ctx context.Context) error { return fl.AcquireRelease(ctx, key) }, fl.RoundTrip)
	} else if !errors.Is(err, floor.ErrUnsupported) {
		return nil, fmt.Errorf("bench: raw floor: %w", err)
	}
	p.set("uncontended Lock+Unlock")
	if _, err := locktest.Interleave(ctx, locktest.Budget{Max: 10}, ops); err != nil {
		return nil, fmt.Errorf("bench: uncontended: %w", err)
	}
	ds, err := locktest.Interleave(ctx, share(30), ops)
	if err != nil {
		return nil, fmt.Errorf("bench: uncontended: %w", err)
	}
	rep.Uncontended = locktest.Summarize(ds[0])
	if len(ds) == 3 {
		rep.FloorStats, rep.RoundTrip = locktest.Summarize(ds[1]), locktest.Summarize(ds[2])
		if rep.FloorStats.P50 > 0 {
			rep.XFloor = float64(rep.Uncontended.P50) / float64(rep.FloorStats.P50)
		}
	}

	p.set(fmt.Sprintf("hot lock, %d goroutines", f.goroutines))
	lockers := make([]locktest.LockFunc, f.goroutines)
	for g := range lockers {
		lockers[g] = locktest.MutexLocker(cs[g%4].NewMutex(name+"-hot", nil))
	}
	hr, err := locktest.HotLock(ctx, share(25), lockers)
	if err != nil {
		return nil, fmt.Errorf("bench: hot lock: %w", err)
	}
	rep.Hot.Goroutines = f.goroutines
	rep.Hot.Handoff = locktest.Summarize(hr.Handoffs)
	rep.Hot.OpsPerSec, rep.Hot.RetakeShare = hr.OpsPerSec(), hr.RetakeShare()

	p.set("wake-up of a blocked waiter")
	wake, err := locktest.Wake(ctx, share(15), locktest.WakeSettle,
		locktest.MutexLocker(cs[0].NewMutex(name+"-wake", nil)), locktest.MutexLocker(cs[1].NewMutex(name+"-wake", nil)))
	if err != nil {
		return nil, fmt.Errorf("bench: wake-up: %w", err)
	}
	rep.Wake = locktest.Summarize(wake)

	// Fairness: the hold is locktest.FairHold when the share is
	// locktest.FairDuration or more, shorter in a shorter run, so that each
	// goroutine still comes back several times.
	fd := share(20).Duration
	fhold := min(max(fd/40, time.Millisecond), locktest.FairHold)
	p.set(fmt.Sprintf("fairness, %d goroutines holding %v", locktest.FairContenders, fhold))
	fl9 := make([]locktest.LockFunc, locktest.FairContenders)
	for g := range fl9 {
		fl9[g] = locktest.MutexLocker(cs[g%locktest.FairClients].NewMutex(name+"-fair", nil))
	}
	fr, err := locktest.Fair(ctx, fd, fhold, fl9)
	if err != nil {
		return nil, fmt.Errorf("bench: fairness: %w", err)
	}
	rep.Fair.Contenders, rep.Fair.Hold = locktest.FairContenders, fhold
	rep.Fair.Wait, rep.Fair.MaxWait = locktest.Summarize(fr.Waits), fr.MaxWait
	rep.Fair.MinGrants = slices.Min(fr.PerGoroutine(locktest.FairContenders))
	rep.Fair.RetakeShare = fr.RetakeShare()

	p.set(fmt.Sprintf("Lock+Unlock with %d leases held", f.held))
	holder := cs[4]
	hold := func(ctx context.Context, i int) (func(context.Context) error, error) {
		return locktest.MutexLocker(holder.NewMutex(fmt.Sprintf("%s-held-%d", name, i), nil))(ctx)
	}
	levels := []int{0}
	if f.held > 0 {
		levels = append(levels, f.held)
	}
	hres, err := locktest.ManyHeld(ctx, levels, share(10), once(holder, name+"-probe"), hold)
	switch {
	case errors.Is(err, locktest.ErrHold) && len(hres.Levels) > 0 && ctx.Err() == nil:
		// Session-bound modes pin a connection per held lock: holding
		// more than the pool is not possible, which is worth showing.
		rep.Held.Error = err.Error()
	case err != nil:
		return nil, fmt.Errorf("bench: many held: %w", err)
	}
	rep.Held.Levels, rep.Held.Ratio = hres.Levels, hres.Ratio()
	rep.Held.AcquirePerLease, rep.Held.BytesPerLease = hres.AcquirePerLease, hres.BytesPerLease
	rep.Elapsed = time.Since(p.start)
	return rep, nil
}

// writeBenchTable prints rep as an aligned table.
func writeBenchTable(w io.Writer, rep *benchReport) error {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "backend\t%s\n\n", rep.URL)
	fmt.Fprintln(tw, "SCENARIO\tP50\tP99\tSAMPLES\tNOTE")
	line := func(what string, s locktest.Stats, note string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", what, roundLatency(s.P50), roundLatency(s.P99), s.N, note)
	}
	note := ""
	if rep.XFloor > 0 {
		note = fmt.Sprintf("%.2f× the raw floor", rep.XFloor)
	}
	line("Lock+Unlock, uncontended", rep.Uncontended, note)
	if rep.Floor != "" {
		line("raw floor: "+rep.Floor, rep.FloorStats, "same connection kind, interleaved")
		line("raw round trip", rep.RoundTrip, "")
	}
	line(fmt.Sprintf("hot lock hand-off, %d goroutines", rep.Hot.Goroutines), rep.Hot.Handoff,
		fmt.Sprintf("%.0f ops/s, previous holder re-took %.0f%%", rep.Hot.OpsPerSec, 100*rep.Hot.RetakeShare))
	line("wake-up of a blocked waiter", rep.Wake, "release → grant")
	line(fmt.Sprintf("fairness: Lock wait, %d contenders holding %v", rep.Fair.Contenders, rep.Fair.Hold), rep.Fair.Wait,
		fmt.Sprintf("longest wait %s, fewest grants per goroutine %d, previous holder re-took %.0f%%", roundLatency(rep.Fair.MaxWait), rep.Fair.MinGrants, 100*rep.Fair.RetakeShare))
	for i, l := range rep.Held.Levels {
		note := ""
		if i > 0 {
			note = fmt.Sprintf("%.2f× the cost with none; %s and %.0f B of heap per lease", rep.Held.Ratio, roundLatency(rep.Held.AcquirePerLease), rep.Held.BytesPerLease)
		}
		line(fmt.Sprintf("Lock+Unlock, %d leases held", l.Held), l.Op, note)
	}
	if rep.Held.Error != "" {
		fmt.Fprintf(tw, "\nmany held: %s\n", rep.Held.Error)
	}
	fmt.Fprintf(tw, "\ntook %s\n", rep.Elapsed.Round(time.Second/10))
	return tw.Flush()
}

// roundLatency prints d to three significant digits ("-" for none).
func roundLatency(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond).String()
	}
	return d.String()
}

// progress keeps one line on stderr up to date while the bench runs: each
// step overwrites the last (carriage return, padded with spaces), and done
// blanks it.
type progress struct {
	w     io.Writer
	e     *env
	start time.Time
	total time.Duration
	width int // of the line shown, 0 for none
}

func (p *progress) set(step string) {
	left := max(p.total-time.Since(p.start), 0).Round(time.Second)
	p.show(fmt.Sprintf("dlock bench: %s (about %s left)", p.e.scrub(step), left))
}

func (p *progress) show(s string) {
	pad := max(p.width-len(s), 0)
	fmt.Fprint(p.w, "\r"+s+strings.Repeat(" ", pad))
	p.width = len(s)
}

func (p *progress) done() {
	if p.width > 0 {
		p.show("")
		fmt.Fprint(p.w, "\r")
	}
}
