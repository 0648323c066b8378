package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/spf13/cobra"
)

const runLong = `Run takes the lock NAME, runs CMD while holding it, and releases it when CMD
exits. The lease is renewed in the background every TTL/3. CMD gets the
environment of dlock, without DLOCK_URL and DLOCK_URL_FILE (CMD is not given
the backend's credentials; DLOCK_URL_WITHHELD names them instead, and a dlock
run by CMD then needs --url-file or DLOCK_URL_FILE), plus:

  DLOCK_NAME   the lock's name
  DLOCK_TOKEN  the fencing token (decimal): strictly greater than every token
               granted before for NAME; pass it to the resource you write
  DLOCK_TTL    the lease's TTL in seconds (decimal; --ttl, else the URL's ttl,
               else 30, or the TTL the backend granted), renewed every third
  DLOCK_KEY    where the backend keeps the grant (the etcd key, ZooKeeper
               node or Redis key), as etcdctl lock prints it; unset where
               the backend names none

The backend URL comes from --url or --url-file, else $DLOCK_URL or
$DLOCK_URL_FILE, else the SQLite default. A password in --url is visible to
other users in ps; --url-file FILE keeps it in a file (mode 0600).

NAME is a mutex by default. --shared and --exclusive take the read and the
write side of NAME's read/write lock instead (like flock -s and -x: any number
of --shared runs at once, or one --exclusive run; a waiting --exclusive run
holds new --shared runs back). --permits N takes one of N permits of NAME's
semaphore (like consul lock -n): at most N runs at once, and every run of the
semaphore must give the same N. The mutex, the read/write lock and the
semaphore called NAME are three different locks. A backend without read/write
locks or semaphores refuses those flags (exit 64).

By default run waits for the lock as long as it takes (like flock and
consul lock); --wait bounds the wait and --no-wait makes a single attempt.

CMD runs in its own process group. SIGINT, SIGTERM and SIGHUP sent to dlock
are forwarded to that group once (a terminal's Ctrl-C reaches dlock, which
passes it on, so CMD does not see it twice). Ctrl-Z stops CMD's group, then
dlock; fg resumes both. Because the group is not the terminal's foreground
group, CMD must not read from the terminal.

If dlock dies by any means, SIGKILL included, CMD's whole process group is
killed too, since nobody renews its lease: dlock starts CMD through a small
guard process that notices dlock's end and kills the job (on Linux, also the
descendants that left the group with setsid). See docs/cli.md.

If the lease is lost while CMD runs (renewal could not confirm it in time,
or the backend dropped it), dlock sends SIGTERM to CMD's process group, then
SIGKILL after --kill-grace, and exits 76.

-v says, while run waits, who holds the lock (owner, token, time left where
the backend knows) each time that changes, and when the lock is granted and
released; renewal failures are warned about in any case. --log-format json
prints every message as a JSON record instead.

Exit codes:
  CMD's own   CMD exited by itself (128+N if it died of signal N)
  64          bad flag, argument, lock name or URL
  69          backend unreachable or failing
  70          internal error in dlock
  75          lock not acquired: held, with --no-wait or after --wait ran out
              (--conflict-exit-code N changes it, like flock -E)
  76          lease lost while CMD ran; CMD was stopped
  126, 127    CMD could not be started / was not found
  128+N       dlock got signal N while waiting for the lock (CMD not run)`

// runFlags are the settings of one "dlock run".
type runFlags struct {
	url       urlFlags
	ttl       time.Duration
	wait      time.Duration
	waitSet   bool
	noWait    bool
	lockDelay time.Duration
	killGrace time.Duration
	owner     string
	conflict  int  // exit code when the lock is not acquired
	shared    bool // the read side of NAME's read/write lock
	exclusive bool // the write side of NAME's read/write lock
	permits   int  // > 0: one permit of NAME's semaphore of this size

	// troubled is set when the lease was lost or its release failed: the
	// backend may not be answering, so closing the client is not waited
	// for long (closeClient).
	troubled bool
}

// troubledCloseWait bounds closing the client after a lost lease or a
// failed release: what Close would release is gone or expiring anyway, and
// an unanswering backend (a paused etcd) would hold dlock's exit for its
// whole timeout after CMD is gone.
const troubledCloseWait = 300 * time.Millisecond

// defaultKillGrace is how long run lets CMD handle SIGTERM after a lost
// lease before it sends SIGKILL.
const defaultKillGrace = 10 * time.Second

// releaseTimeout bounds the Unlock after CMD exits.
const releaseTimeout = 10 * time.Second

func newRunCmd(e *env) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [flags] NAME -- CMD [ARGS...]",
		Short: "Run a command while holding a lock",
		Long:  runLong,
		Example: `  dlock run nightly-report -- ./report.sh
  dlock run --no-wait --ttl 1m deploy -- make deploy
  dlock run --shared config -- ./read-config.sh     # readers share, like flock -s
  dlock run --exclusive config -- ./write-config.sh # excludes the --shared runs
  dlock run --permits 4 encoders -- ffmpeg ...      # at most 4 at once
  DLOCK_URL=redis://localhost:6379/0 dlock run --wait 5m orders/42 -- sh -c 'echo token $DLOCK_TOKEN'`,
		Args: cobra.ArbitraryArgs, // checked in RunE, for clearer messages
		RunE: func(cmd *cobra.Command, args []string) error {
			name, argv, err := splitRunArgs(args, cmd.ArgsLenAtDash())
			if err != nil {
				return usageErr(err)
			}
			f.waitSet = cmd.Flags().Changed("wait")
			if f.waitSet && f.noWait {
				return usageErr(errors.New("run: --wait and --no-wait cannot be used together"))
			}
			if f.shared && f.exclusive {
				return usageErr(errors.New("run: --shared and --exclusive cannot be used together (the read or the write side of the lock, not both)"))
			}
			if cmd.Flags().Changed("permits") {
				if f.shared || f.exclusive {
					return usageErr(errors.New("run: --permits cannot be used with --shared or --exclusive (a semaphore permit or a side of a read/write lock, not both)"))
				}
				if f.permits < 1 {
					return usageErr(fmt.Errorf("run: --permits must be at least 1, got %d", f.permits))
				}
			}
			return f.run(e, name, argv)
		},
	}
	fl := cmd.Flags()
	f.url.register(cmd, defaultURLHelp)
	f.url.registerConnect(cmd)
	fl.DurationVar(&f.ttl, "ttl", 0, "lease TTL, renewed every TTL/3 (default 30s, or the URL's ttl parameter)")
	fl.DurationVar(&f.wait, "wait", 0, "give up (exit 75) if the lock is not acquired within this time (default: wait forever; 0: try once)")
	fl.BoolVar(&f.noWait, "no-wait", false, "try once; exit 75 at once if the lock is held")
	fl.DurationVar(&f.lockDelay, "lock-delay", 0, "keep the lock unavailable this long after this holder's lease is lost without release (default 0, or the URL's lock_delay parameter)")
	fl.DurationVar(&f.killGrace, "kill-grace", defaultKillGrace, "after a lost lease, time between SIGTERM and SIGKILL to CMD (0: SIGKILL at once)")
	fl.IntVar(&f.conflict, "conflict-exit-code", exitNotAcquired, "exit code when the lock is not acquired (--no-wait, --wait ran out), like flock -E")
	fl.StringVar(&f.owner, "owner", "", "explicit owner id (printable ASCII): the same owner re-enters a lock it holds (default: a random id)")
	fl.BoolVar(&f.shared, "shared", false, "take NAME's read/write lock for reading (like flock -s): any number of --shared runs at once, none while an --exclusive run holds or waits")
	fl.BoolVar(&f.exclusive, "exclusive", false, "take NAME's read/write lock for writing (like flock -x): excludes --shared and other --exclusive runs of NAME (a run with neither flag takes the mutex NAME, a different lock)")
	fl.IntVar(&f.permits, "permits", 0, "take one of N permits of NAME's semaphore: at most N runs at once (every run of NAME must give the same N)")
	return cmd
}

// splitRunArgs separates NAME from CMD. dash is cobra's ArgsLenAtDash: -1
// when there was no "--", else how many arguments came before it.
func splitRunArgs(args []string, dash int) (string, []string, error) {
	switch {
	case len(args) == 0:
		return "", nil, errors.New("run: missing lock NAME and command (usage: dlock run [flags] NAME -- CMD [ARGS...])")
	case dash == 0:
		return "", nil, errors.New("run: the lock NAME must come before \"--\" (usage: dlock run [flags] NAME -- CMD [ARGS...])")
	case dash > 1:
		return "", nil, fmt.Errorf("run: expected one lock NAME before \"--\", got %d arguments", dash)
	case len(args) == 1:
		return "", nil, fmt.Errorf("run: missing the command to run after NAME %q (usage: dlock run [flags] NAME -- CMD [ARGS...])", args[0])
	case args[1] == "":
		return "", nil, errors.New("run: the command to run is an empty string")
	}
	return args[0], args[1:], nil
}

// validate checks what the library would not: negative durations are
// refused here with the flag's name.
func (f *runFlags) validate() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--ttl", f.ttl}, {"--wait", f.wait}, {"--lock-delay", f.lockDelay}, {"--kill-grace", f.killGrace}} {
		if d.v < 0 {
			return usageErr(fmt.Errorf("run: %s must not be negative, got %v", d.flag, d.v))
		}
	}
	return checkConflictCode("run", f.conflict)
}

// checkConflictCode refuses an exit code a process cannot exit with.
func checkConflictCode(cmd string, code int) error {
	if code < 0 || code > 255 {
		return usageErr(fmt.Errorf("%s: --conflict-exit-code must be 0 to 255, got %d", cmd, code))
	}
	return nil
}

// signalError is the cause of a wait abandoned because dlock got a signal.
type signalError struct{ sig os.Signal }

func (s signalError) Error() string { return "interrupted by " + s.sig.String() }

func (f *runFlags) run(e *env, name string, argv []string) error {
	if err := f.validate(); err != nil {
		return err
	}
	sigs, stopSigs := e.notify()
	defer stopSigs()

	// Until CMD starts, a signal abandons opening the backend and waiting.
	waitCtx, cancelWait := context.WithCancelCause(context.Background())
	defer cancelWait(nil)
	var sc stopClient // the Client, once open, for Ctrl-Z
	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case s := <-sigs:
				switch s {
				case syscall.SIGTSTP:
					sc.stop(e)
				case syscall.SIGCONT:
				default:
					cancelWait(signalError{s})
					return
				}
			case <-stopWatch:
				return
			}
		}
	}()
	lease, op, err := f.acquire(waitCtx, e, name, &sc)
	close(stopWatch)
	<-watchDone
	if op != nil {
		defer f.closeClient(e, op.client)
	}
	var se signalError
	if errors.As(context.Cause(waitCtx), &se) {
		if lease != nil {
			f.release(e, lease)
		}
		return &exitError{code: 128 + signum(se.sig)}
	}
	if err != nil {
		return err
	}
	return f.runChild(e, &sc, lease, sigs, argv)
}

// acquire opens the backend and takes the lock as the flags say.
// sc is given the Client as soon as it is open.
func (f *runFlags) acquire(ctx context.Context, e *env, name string, sc *stopClient) (*dlock.Lease, *opened, error) {
	raw, err := f.url.backendURL(e, "run")
	if err != nil {
		return nil, nil, err
	}
	if e.verbose {
		reportBackend(e, raw, true)
	}
	op, err := f.url.open(ctx, e, raw)
	if err != nil {
		return nil, nil, err
	}
	client := op.client
	sc.set(client)
	opts := &dlock.MutexOptions{TTL: f.ttl, LockDelay: f.lockDelay, Owner: f.owner}
	lock, try := f.lockFuncs(client, name, opts)
	var (
		lease   *dlock.Lease
		expired bool // --wait ran out
	)
	switch {
	case f.noWait || (f.waitSet && f.wait == 0):
		lease, err = try(ctx)
	case f.waitSet:
		lctx, cancel := context.WithTimeout(ctx, f.wait)
		stop := f.reportWaiting(lctx, e, client, name)
		lease, err = lock(lctx)
		stop()
		expired = err != nil && ctx.Err() == nil && errors.Is(lctx.Err(), context.DeadlineExceeded)
		cancel()
	default:
		stop := f.reportWaiting(ctx, e, client, name)
		lease, err = lock(ctx)
		stop()
	}
	switch {
	case err == nil:
		e.info("dlock: acquired", "name", name, "type", f.typeName(), "token", lease.Token(), "owner", lease.Owner())
		return lease, op, nil
	case errors.Is(err, dlock.ErrInvalid), errors.Is(err, dlock.ErrUnsupported):
		// A flag the backend cannot honour (--shared, --permits, --lock-delay
		// on a backend without them) is bad input for this backend.
		return nil, op, usageErr(err)
	case errors.Is(err, dlock.ErrLocked):
		return nil, op, exitf(f.conflict, "%s%s (not waiting)", f.heldMessage(name), lockedDetail(err))
	case expired:
		return nil, op, exitf(f.conflict, "lock %q not acquired within %v", name, f.wait)
	default:
		return nil, op, &exitError{code: classify(err), err: err}
	}
}

// lockedDetail says what a refused TryLock learnt about the holder, e.g.
// " (token 7; free in at most 12.3s)", or "" when the backend said nothing.
func lockedDetail(err error) string {
	var le *driver.LockedError
	if !errors.As(err, &le) {
		return ""
	}
	var parts []string
	if le.Token > 0 {
		parts = append(parts, "token "+strconv.FormatUint(le.Token, 10))
	}
	if le.RetryAfter > 0 {
		parts = append(parts, "free in at most "+roundDuration(le.RetryAfter))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// typeName is the status TYPE of the lock the flags name.
func (f *runFlags) typeName() string {
	switch {
	case f.shared || f.exclusive:
		return "rwlock"
	case f.permits > 0:
		return "semaphore"
	}
	return "mutex"
}

// reportWaiting says, with -v, who holds the lock while acquire waits for
// it: once the wait has lasted a moment, then each time the holder, its
// token or the number of holders changes. It lists the lock with Inspect
// every second. stop ends it and waits for it.
func (f *runFlags) reportWaiting(ctx context.Context, e *env, c *dlock.Client, name string) (stop func()) {
	if !e.verbose {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchHolder(ctx, e, c, name, f.typeName(), "dlock: waiting")
	}()
	return func() {
		cancel()
		<-done
	}
}

// watchHolder logs, under msg, who holds the lock name of type typ each
// time that changes, until ctx ends. The first report comes after a short
// delay, so that a lock granted at once says nothing.
func watchHolder(ctx context.Context, e *env, c *dlock.Client, name, typ, msg string) {
	const firstDelay, every = 300 * time.Millisecond, time.Second
	t := time.NewTimer(firstDelay)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(every)
		infos, err := c.Inspect(ctx, name)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, dlock.ErrUnsupported):
			e.info(msg, "name", name, "holder", "unknown (this backend cannot list its locks)")
			return
		case err != nil:
			if s := "error"; s != last {
				last = s
				e.info(msg, "name", name, "holder", "unknown", "err", message(err))
			}
			continue
		}
		li, ok := findLock(infos, name, typ)
		attrs := holderAttrs(li, ok)
		// Report a change of holder, token or count, not the ticking expiry.
		key := fmt.Sprint(attrs[:len(attrs)-2])
		if key == last {
			continue
		}
		last = key
		e.info(msg, append([]any{"name", name}, attrs...)...)
	}
}

// findLock picks name's lock of type typ out of an Inspect listing.
func findLock(infos []dlock.LockInfo, name, typ string) (dlock.LockInfo, bool) {
	for _, li := range infos {
		if li.Name == name && lockType(li) == typ {
			return li, true
		}
	}
	return dlock.LockInfo{}, false
}

// holderAttrs describes who holds a lock as slog attributes, ending with
// expires_in (which the caller may leave out of a comparison): owner (a
// read/write lock's writer), readers or permits taken, token, and the time
// left, "unknown" where the backend cannot tell.
func holderAttrs(li dlock.LockInfo, found bool) []any {
	if !found || !held(li) {
		// Free (or within a lock-delay the backend does not report).
		return []any{"holder", "none", "token", li.Token, "expires_in", "-"}
	}
	var attrs []any
	switch {
	case li.Owner != "":
		attrs = append(attrs, "owner", li.Owner)
	case li.Readers > 0:
		attrs = append(attrs, "readers", li.Readers)
	case li.Holders > 0:
		attrs = append(attrs, "permits_taken", fmt.Sprintf("%d of %d", li.Holders, li.Permits))
	}
	attrs = append(attrs, "token", li.Token)
	if li.ExpiresIn >= 0 {
		return append(attrs, "expires_in", roundDuration(li.ExpiresIn))
	}
	return append(attrs, "expires_in", "unknown")
}

// lockFuncs returns the waiting and one-shot acquire of the lock the flags
// name: a mutex, a read lock (--shared) or a semaphore permit (--permits).
func (f *runFlags) lockFuncs(c *dlock.Client, name string, opts *dlock.MutexOptions) (lock, try func(context.Context) (*dlock.Lease, error)) {
	switch {
	case f.shared:
		rw := c.NewRWMutex(name, opts)
		return rw.RLock, rw.TryRLock
	case f.exclusive:
		rw := c.NewRWMutex(name, opts)
		return rw.Lock, rw.TryLock
	case f.permits > 0:
		sem := c.NewSemaphore(name, f.permits, opts)
		return sem.Acquire, sem.TryAcquire
	}
	m := c.NewMutex(name, opts)
	return m.Lock, m.TryLock
}

// heldMessage says why the lock the flags name was refused.
func (f *runFlags) heldMessage(name string) string {
	switch {
	case f.shared:
		return fmt.Sprintf("read/write lock %q is held or awaited by a writer", name)
	case f.exclusive:
		return fmt.Sprintf("read/write lock %q is held", name)
	case f.permits > 0:
		return fmt.Sprintf("all %d permits of semaphore %q are taken", f.permits, name)
	}
	return fmt.Sprintf("lock %q is held by another owner", name)
}

// runChild runs CMD under the lease, through a guard process (guard.go),
// and decides the exit code.
func (f *runFlags) runChild(e *env, sc *stopClient, lease *dlock.Lease, sigs <-chan os.Signal, argv []string) error {
	// exec.Command resolves CMD in $PATH as it always did; the guard only
	// executes the result.
	c := exec.Command(argv[0], argv[1:]...)
	if c.Err != nil {
		f.release(e, lease)
		code := exitCannotExec
		if errors.Is(c.Err, exec.ErrNotFound) || errors.Is(c.Err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return exitf(code, "run: cannot start %q: %v", argv[0], startErr(c.Err))
	}
	job, err := startGuarded(e, c.Path, argv, childEnv(e.environ(), lease.Name(), lease.Token(), lease.TTL(), lease.Key()))
	if err != nil {
		f.release(e, lease)
		var se *startError
		if errors.As(err, &se) {
			return exitf(se.code, "run: cannot start %q: %v", argv[0], se.err)
		}
		return exitf(exitInternal, "run: %v", err)
	}
	defer job.life.Close()
	pgid, waited := job.pgid, job.waited

	var (
		lost    bool
		done    = lease.Done()
		killC   <-chan time.Time
		killT   *time.Timer
		waitErr error
	)
loop:
	for {
		select {
		case waitErr = <-waited:
			break loop
		case s := <-sigs:
			switch s {
			case syscall.SIGTSTP:
				// Ctrl-Z: stop CMD first, so that it never runs while
				// dlock, stopped, cannot renew the lease; then stop.
				_ = syscall.Kill(-pgid, syscall.SIGSTOP)
				sc.stop(e)
			case syscall.SIGCONT:
				// Resume CMD only if the lease outlived the stop; if not,
				// the loss is handled below as soon as Done closes.
				if lease.ValidFor() > 0 {
					_ = syscall.Kill(-pgid, syscall.SIGCONT)
				}
			default:
				if ss, ok := s.(syscall.Signal); ok {
					_ = syscall.Kill(-pgid, ss)
				}
			}
		case <-done:
			done, lost = nil, true
			if f.killGrace == 0 {
				e.warnf("dlock: lease lost on %q: %s; killing %s", lease.Name(), lossCause(lease), argv[0])
				job.kill()
				continue
			}
			e.warnf("dlock: lease lost on %q: %s; stopping %s (SIGTERM, SIGKILL after %v)",
				lease.Name(), lossCause(lease), argv[0], f.killGrace)
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			_ = syscall.Kill(-pgid, syscall.SIGCONT) // a stopped CMD must run to handle SIGTERM
			killT = time.NewTimer(f.killGrace)
			killC = killT.C
		case <-killC:
			killC = nil
			e.warnf("dlock: %s still running %v after SIGTERM; sending SIGKILL", argv[0], f.killGrace)
			job.kill()
		}
	}
	if killT != nil {
		killT.Stop()
	}
	ps := job.guard.ProcessState
	guardDied := ps == nil || !ps.Exited()
	if guardDied {
		// The guard never dies of a signal by itself (it ignores the
		// usual ones): someone SIGKILLed it. CMD must not run on unguarded.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	if lost || lease.Err() != nil {
		f.troubled = true
		if !lost {
			// Lost in the instant CMD exited: its end may have overlapped
			// the next holder, so the run is not reported as clean.
			e.warnf("dlock: lease lost on %q as %s exited: %s", lease.Name(), argv[0], lossCause(lease))
		}
		return &exitError{code: exitLeaseLost}
	}
	f.release(e, lease)
	if guardDied {
		return exitf(exitInternal, "run: dlock's guard process died (%v); killed %s's process group", guardWaitErr(ps, waitErr), argv[0])
	}
	// The guard exits with CMD's status, 128+N if signal N killed CMD.
	return &exitError{code: ps.ExitCode()}
}

// lossCause says why a lease was lost, without the "lease lost" that the
// caller's message says already: the library's error reads "dlock: lease
// lost: <cause>", and causes from drivers repeat "dlock: " in turn.
func lossCause(l *dlock.Lease) string {
	err := l.Err()
	if err == nil {
		return "unknown cause"
	}
	s := strings.TrimPrefix(message(err), "dlock: ")
	s = strings.TrimPrefix(s, "lease lost: ")
	if s == "" || s == "lease lost" {
		return "unknown cause"
	}
	return s
}

// guardWaitErr describes how the guard ended, when it did not exit.
func guardWaitErr(ps *os.ProcessState, waitErr error) any {
	if ps != nil {
		return ps
	}
	return waitErr
}

// closeClient closes the client; after a lost lease or a failed release,
// only for troubledCloseWait, saying so if the backend did not answer in
// that time.
func (f *runFlags) closeClient(e *env, c *dlock.Client) {
	if !f.troubled {
		_ = c.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Close()
	}()
	t := time.NewTimer(troubledCloseWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		e.warnf("dlock: the backend is not answering; exiting without waiting for it (what dlock held there ends with its TTL)")
	}
}

// release gives the lock up on a context of its own: dlock's signals and
// deadlines must not leave it held until its TTL.
func (f *runFlags) release(e *env, lease *dlock.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := lease.Unlock(ctx); err != nil {
		f.troubled = true
		e.warnf("dlock: warning: releasing %q: %s (it frees itself when the lease expires)", lease.Name(), strings.TrimPrefix(message(err), "dlock: "))
		return
	}
	e.info("dlock: released", "name", lease.Name(), "token", lease.Token())
}

// withheldVars are dlock's variables that CMD does not inherit: the two
// that "dlock run" sets anew, and the two that name the backend, which may
// carry its password (CMD is not trusted with it; it gets DLOCK_TOKEN).
var withheldVars = []string{"DLOCK_NAME", "DLOCK_TOKEN", "DLOCK_TTL", "DLOCK_KEY", envURL, envURLFile}

// childEnv is environ without withheldVars, plus DLOCK_NAME, DLOCK_TOKEN,
// DLOCK_TTL (in seconds) and DLOCK_KEY (when the driver names one),
// and $DLOCK_URL_WITHHELD naming the backend variables it left out, if any
// were set: a dlock started by CMD then refuses to fall back to the default
// SQLite file, a backend other than the one CMD's lock is on (backendURL).
func childEnv(environ []string, name string, token uint64, ttl time.Duration, key string) []string {
	out := make([]string, 0, len(environ)+3)
	var withheld []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !slices.Contains(withheldVars, k) {
			out = append(out, kv)
		} else if (k == envURL || k == envURLFile) && v != "" && !slices.Contains(withheld, k) {
			withheld = append(withheld, k)
		}
	}
	if len(withheld) > 0 {
		out = slices.DeleteFunc(out, func(kv string) bool { return strings.HasPrefix(kv, envURLWithheld+"=") })
		out = append(out, envURLWithheld+"="+strings.Join(withheld, ","))
	}
	out = append(out, "DLOCK_NAME="+name, "DLOCK_TOKEN="+strconv.FormatUint(token, 10),
		"DLOCK_TTL="+strconv.FormatFloat(ttl.Seconds(), 'f', -1, 64))
	if key != "" {
		out = append(out, "DLOCK_KEY="+key)
	}
	return out
}

// exitStatus is a shell's view of how a process ended: its exit code, or
// 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// stopSelf stops dlock as SIGTSTP would have, had dlock not caught it.
// SIGCONT (from the shell's fg or bg) resumes it.
func stopSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

func signum(s os.Signal) int {
	if ss, ok := s.(syscall.Signal); ok {
		return int(ss)
	}
	return 1
}

// startErr drops exec's repetition of the program name.
func startErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}
