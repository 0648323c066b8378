package main

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/spf13/cobra"
)

const waitLong = `Wait blocks until the lock NAME is free, without taking it: for a script that
must not start while a job holds the lock, but need not hold it itself (use
"dlock run" to hold it). A lock nobody ever took, or that is free now,
returns at once.

--type says which of NAME's locks: mutex (default; "dlock run NAME"), rwlock
(free when neither a writer nor a reader holds it) or semaphore (free when
no permit is taken). The lock is free when status would show no holder; a
lock kept by a lock-delay after its holder vanished counts as free only where
the backend reports it without a holder.

Wait lists the lock about four times a second (the backend's Inspect); a
backend that cannot list its locks cannot be waited on (exit 69). With -v it
says who holds the lock each time that changes.

Free is a moment, not a promise: another process may take the lock right
after wait returns.

Exit codes:
  0           the lock is free
  64          bad flag, argument, lock name or URL
  69          backend unreachable or failing, or unable to list its locks
  75          still held when --wait ran out (--conflict-exit-code N changes it)
  128+N       dlock got signal N while waiting`

// waitPoll is how often wait lists the lock.
const waitPoll = 250 * time.Millisecond

func newWaitCmd(e *env) *cobra.Command {
	var (
		src      urlFlags
		typ      string
		wait     time.Duration
		conflict int
	)
	cmd := &cobra.Command{
		Use:   "wait [flags] NAME",
		Short: "Wait until a lock is free, without taking it",
		Long:  waitLong,
		Example: `  dlock wait deploy/prod && ./smoke-test.sh
  dlock wait --wait 10m --type rwlock config`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("wait: takes one lock NAME, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if typ != "mutex" && typ != "rwlock" && typ != "semaphore" {
				return usageErr(fmt.Errorf("wait: --type must be mutex, rwlock or semaphore, got %q", typ))
			}
			if wait < 0 {
				return usageErr(fmt.Errorf("wait: --wait must not be negative, got %v", wait))
			}
			if err := checkConflictCode("wait", conflict); err != nil {
				return err
			}
			if !cmd.Flags().Changed("wait") {
				wait = -1 // forever
			}
			return waitFree(e, &src, args[0], typ, wait, conflict)
		},
	}
	src.register(cmd, defaultURLHelp)
	src.registerConnect(cmd)
	fl := cmd.Flags()
	fl.StringVar(&typ, "type", "mutex", "which of NAME's locks: mutex, rwlock or semaphore")
	fl.DurationVar(&wait, "wait", 0, "give up (exit 75) if the lock is still held after this time (default: wait forever; 0: check once)")
	fl.IntVar(&conflict, "conflict-exit-code", exitNotAcquired, "exit code when --wait runs out with the lock still held")
	return cmd
}

// waitFree polls name's lock of type typ until it is free. limit < 0 waits
// forever.
func waitFree(e *env, src *urlFlags, name, typ string, limit time.Duration, conflict int) error {
	if name == "" {
		return usageErr(errors.New("wait: the lock NAME is empty"))
	}
	sigs, stopSigs := e.notify()
	defer stopSigs()
	raw, err := src.backendURL(e, "wait")
	if err != nil {
		return err
	}
	if e.verbose {
		reportBackend(e, raw, true)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var sc stopClient // the Client, once open, for Ctrl-Z
	go func() {
		for {
			select {
			case s := <-sigs:
				switch s {
				case syscall.SIGTSTP:
					sc.stop(e)
				case syscall.SIGCONT:
				default:
					cancel(signalError{s})
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	op, err := src.open(ctx, e, raw)
	if err != nil {
		if se, ok := context.Cause(ctx).(signalError); ok {
			return &exitError{code: 128 + signum(se.sig)}
		}
		return err
	}
	defer op.client.Close()
	sc.set(op.client)

	var deadline <-chan time.Time
	if limit >= 0 {
		t := time.NewTimer(limit)
		defer t.Stop()
		deadline = t.C
	}
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	last := ""
	for {
		ictx, icancel := context.WithTimeout(ctx, statusTimeout)
		infos, err := op.client.Inspect(ictx, name)
		icancel()
		if se, ok := context.Cause(ctx).(signalError); ok {
			return &exitError{code: 128 + signum(se.sig)}
		}
		switch {
		case errors.Is(err, dlock.ErrUnsupported):
			return exitf(exitUnavailable, "wait: this backend cannot list its locks, so it cannot be waited on")
		case err != nil:
			return &exitError{code: exitUnavailable, err: err}
		}
		li, found := findLock(infos, name, typ)
		if !found || !held(li) {
			e.info("dlock: free", "name", name, "type", typ, "token", li.Token)
			return nil
		}
		attrs := holderAttrs(li, found)
		if key := fmt.Sprint(attrs[:len(attrs)-2]); key != last {
			last = key
			e.info("dlock: waiting", append([]any{"name", name}, attrs...)...)
		}
		if limit == 0 {
			return exitf(conflict, "lock %q is held (%s)", name, holderSummary(li))
		}
		select {
		case <-tick.C:
		case <-deadline:
			return exitf(conflict, "lock %q still held after %v (%s)", name, limit, holderSummary(li))
		case <-ctx.Done():
			if se, ok := context.Cause(ctx).(signalError); ok {
				return &exitError{code: 128 + signum(se.sig)}
			}
			return ctx.Err()
		}
	}
}

// holderSummary describes a held lock's holder in a few words, for an
// error message.
func holderSummary(li dlock.LockInfo) string {
	var s string
	switch {
	case li.Owner != "":
		s = "by " + shorten(li.Owner, holderWidth)
	case li.Readers > 0:
		s = fmt.Sprintf("by %d readers", li.Readers)
	case li.Holders > 0:
		s = fmt.Sprintf("%d of %d permits taken", li.Holders, li.Permits)
	}
	if li.Token > 0 {
		s += fmt.Sprintf(", token %d", li.Token)
	}
	if li.ExpiresIn > 0 {
		s += ", expires in " + roundDuration(li.ExpiresIn)
	}
	return s
}
