package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock/check"
	"github.com/spf13/cobra"
)

var checkLong = `Check runs a Jepsen-style test of a lock backend on this machine: worker
processes contend for a few lock names, write through a fenced resource
while they hold them, and the checker injects faults and then checks the
history against dlock's guarantees (docs/checker.md).

The backend is --url URL (any dlock URL), or --spawn KIND to let the checker
start its own servers on loopback: ` + strings.Join(check.Kinds, ", ") + `, with the
SQL mode after a slash (postgres/advisory, mysql/getlock, …), and
redis-sentinel/wait (min_replicas=1, the default) or redis-sentinel/async.
Server-side faults need --spawn.

Faults (--fault, repeatable or comma-separated; injected in turn, over and
over, after a warm-up):
  pause-holder    SIGSTOP a worker holding a lock for longer than the TTL
  kill-holder     SIGKILL a worker holding a lock (a new worker replaces it)
  partition       cut worker 0 off from the servers (TCP proxy), then heal
  latency         slow worker 0's traffic by TTL/4 each way
  restart-server  kill a server and restart it with its data (--spawn)
  restart-wiped   kill a Redis server and restart it empty (--spawn)
  pause-server    SIGSTOP a server for longer than the TTL (--spawn)
  kill-leader     kill and restart the leader of 3 etcd/ZooKeeper members
  clock-jump      move a server's clock forward by 5×TTL (--spawn)
  kill-session    kill the holder's SQL session (--spawn, session modes)
  failover-master kill a Sentinel-managed master while its replicas lag,
                  so Sentinel promotes one (--spawn redis-sentinel)

The summary table lists each violation class with its count and evidence;
violations docs/backends.md admits for the fault (a Redis restarted without
its data, a server clock jump) are marked "admitted by the docs".

Exit codes: 0 no violation beyond what the docs admit; 1 violations;
64 bad flag or URL, or a fault that does not apply; 69 the run could not be
carried out (servers would not start, workers could not run).`

// checkFlags are the settings of one "dlock check".
type checkFlags struct {
	url           urlFlags
	spawn         string
	faults        []string
	workers, gs   int
	locks         int
	duration, ttl time.Duration
	lockDelay     time.Duration
	asJSON        bool
	html, events  string
}

func newCheckCmd(e *env) *cobra.Command {
	f := &checkFlags{}
	cmd := &cobra.Command{
		Use:   "check [flags]",
		Short: "Test a backend's lock guarantees under faults",
		Long:  checkLong,
		Example: `  dlock check --spawn redis --fault pause-holder --fault kill-holder
  dlock check --spawn etcd --fault kill-leader --duration 1m --html etcd.html
  dlock check --url postgres://me@db/locks?mode=advisory --fault partition --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCheck(cmd, e, f)
		},
	}
	fl := cmd.Flags()
	f.url.register(cmd, "to check (or --spawn)")
	fl.StringVar(&f.spawn, "spawn", "", "start the backend's servers: "+strings.Join(check.Kinds, "|")+" (SQL: kind/mode)")
	fl.StringSliceVar(&f.faults, "fault", nil, "fault to inject (repeatable): "+strings.Join(check.Faults, ", "))
	fl.IntVar(&f.workers, "workers", 3, "worker processes")
	fl.IntVar(&f.gs, "goroutines", 3, "contending goroutines per worker")
	fl.IntVar(&f.locks, "locks", 2, "lock names")
	fl.DurationVar(&f.duration, "duration", 20*time.Second, "how long the workload runs")
	fl.DurationVar(&f.ttl, "ttl", 0, "lease TTL (default 1s; 2s for etcd and zk)")
	fl.DurationVar(&f.lockDelay, "lock-delay", 0, "lock-delay the workers ask for")
	fl.BoolVar(&f.asJSON, "json", false, "print the report as JSON instead of the table")
	fl.StringVar(&f.html, "html", "", "write a timeline of the run to this HTML file")
	fl.StringVar(&f.events, "events", "", "write the whole history (JSON) to this file")
	return cmd
}

// newCheckWorkerCmd is the hidden body of a checker's worker process.
func newCheckWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "check-worker",
		Hidden: true,
		Args:   cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !check.IsWorker() {
				return usageErr(errors.New("check-worker: runs only as a worker started by dlock check"))
			}
			if code := check.WorkerMain(); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
}

func runCheck(cmd *cobra.Command, e *env, f *checkFlags) error {
	if (f.url.url == "" && f.url.file == "") == (f.spawn == "") {
		return usageErr(errors.New("check: give exactly one of --url (or --url-file) and --spawn"))
	}
	// check names its backend by flag only: $DLOCK_URL is not read.
	rawURL, err := f.url.fromFlags(e, "check")
	if err != nil {
		return err
	}
	var faults []string
	for _, s := range f.faults {
		for _, x := range strings.Split(s, ",") {
			if x = strings.TrimSpace(x); x != "" {
				faults = append(faults, x)
			}
		}
	}
	cfg := check.Config{URL: rawURL, Spawn: f.spawn, Faults: faults, Workers: f.workers, Goroutines: f.gs,
		Locks: f.locks, Duration: f.duration, TTL: f.ttl, LockDelay: f.lockDelay}
	stderr := cmd.ErrOrStderr()
	progressed := false
	cfg.Progress = func(line string) {
		progressed = true
		fmt.Fprint(stderr, e.scrub(line))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h, err := check.Run(ctx, cfg)
	if progressed {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		if errors.Is(err, check.ErrBadConfig) {
			return usageErr(err)
		}
		return &exitError{code: exitUnavailable, err: err}
	}
	rep := check.Analyze(h)
	if f.events != "" {
		if err := writeFile(f.events, func(w *os.File) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", " ")
			return enc.Encode(h)
		}); err != nil {
			return &exitError{code: exitUnavailable, err: fmt.Errorf("check: --events: %w", err)}
		}
	}
	if f.html != "" {
		if err := writeFile(f.html, func(w *os.File) error { return check.WriteHTML(w, h, rep) }); err != nil {
			return &exitError{code: exitUnavailable, err: fmt.Errorf("check: --html: %w", err)}
		}
	}
	// The report is masked as a whole, so a secret can never straddle two
	// writes and slip through.
	var out bytes.Buffer
	if f.asJSON {
		err = rep.WriteJSON(&out)
	} else {
		err = rep.WriteText(&out)
	}
	if err == nil {
		_, err = io.WriteString(cmd.OutOrStdout(), e.scrub(out.String()))
	}
	if err != nil {
		return &exitError{code: exitUnavailable, err: err}
	}
	if rep.Failed() {
		return &exitError{code: 1}
	}
	return nil
}

// writeFile creates path and fills it with write.
func writeFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
