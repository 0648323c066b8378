package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
)

const statusLong = `Status lists the locks whose names start with PREFIX (all locks if omitted)
on the backend, with their holder and last fencing token:

  NAME        the lock's name
  TYPE        mutex, rwlock (a read/write lock: dlock run --shared or
              --exclusive) or semaphore/N (N permits: dlock run --permits N)
  HOLDER      the holder's owner id, shortened to 12 characters (a foreign
              client's session, etcd-lease:ID or zk-session:ID); for a
              read/write lock held by readers "N readers", for a semaphore
              "H of N" permits taken ("-" if free)
  TOKEN       the last fencing token granted for the name and type
  EXPIRES-IN  how long until the lock can be taken if its holder neither
              renews nor releases it: the remaining lease plus any
              lock-delay, the longest of several holders' ("-" if free or
              unknown, as on session-bound backends)
  WAITERS     processes waiting for it ("-" where the backend cannot tell)

A name used as a mutex, a read/write lock and a semaphore is listed once per
type: they are different locks.

--json prints an array of objects instead, for scripts:
  {"name": "...", "type": "mutex", "owner": "...", "token": 7, "count": 1,
   "expires_in_ms": 2900, "waiters": null, "readers": 0, "holders": 0,
   "permits": 0}
type is "mutex", "rwlock" or "semaphore"; owner is the holder (the writer of
an rwlock, "" for readers and semaphores), count the hold count (0 when
free); readers counts an rwlock's read holders; holders and permits are a
semaphore's permits taken and its size. expires_in_ms and waiters are null
when unknown.

On stderr, status notes a connection over the network that is not verified
TLS ("tls: none" or "tls: unverified", with the setting that decides it);
-v prints the backend URL (password masked) and its TLS state in any case.

Exit codes: 0 listed; 64 bad flag or URL; 69 backend unreachable, failing, or
unable to list locks.`

// statusTimeout bounds opening the backend and listing its locks.
const statusTimeout = 30 * time.Second

// holderWidth is how much of an owner id the table shows.
const holderWidth = 12

func newStatusCmd(e *env) *cobra.Command {
	var (
		src    urlFlags
		asJSON bool
		watch  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status [flags] [PREFIX]",
		Short: "List locks, their holders and tokens",
		Long:  statusLong,
		Example: `  dlock status
  dlock status --json orders/
  dlock status --watch jobs/      # refreshed every 2s in place; Ctrl-C ends it`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageErr(fmt.Errorf("status: takes at most one PREFIX, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			if cmd.Flags().Changed("watch") && watch < 100*time.Millisecond {
				return usageErr(fmt.Errorf("status: --watch interval must be at least 100ms, got %v", watch))
			}
			raw, err := src.backendURL(e, "status")
			if err != nil {
				return err
			}
			reportBackend(e, raw, e.verbose)
			ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
			defer cancel()
			op, err := src.open(ctx, e, raw)
			if err != nil {
				return err
			}
			defer op.client.Close()
			out := cmd.OutOrStdout()
			if watch > 0 {
				return watchStatus(e, op.client, out, prefix, asJSON, watch)
			}
			infos, err := inspect(ctx, op.client, prefix)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(out, infos)
			}
			return writeTable(out, infos)
		},
	}
	src.register(cmd, defaultURLHelp)
	src.registerConnect(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "print a JSON array for scripts")
	fl.DurationVar(&watch, "watch", 0, "list again every interval until interrupted: in place on a terminal, one table (or one JSON array per line) after another otherwise (--watch alone: every 2s; --watch=500ms)")
	fl.Lookup("watch").NoOptDefVal = "2s"
	return cmd
}

// inspect lists the locks under prefix.
func inspect(ctx context.Context, client *dlock.Client, prefix string) ([]dlock.LockInfo, error) {
	infos, err := client.Inspect(ctx, prefix)
	switch {
	case errors.Is(err, dlock.ErrUnsupported):
		return nil, &exitError{code: exitUnavailable, err: errCannotList}
	case err != nil:
		return nil, &exitError{code: exitUnavailable, err: err}
	}
	return infos, nil
}

// errCannotList is the error of a backend without Inspect.
var errCannotList = errors.New("status: this backend cannot list its locks")

// watchStatus lists the locks every interval until SIGINT, SIGTERM or SIGHUP
// (exit 0). On a terminal each listing replaces the last (the screen is
// cleared, as watch(1) does); elsewhere listings follow each other, a table
// after a blank line and a time stamp, JSON as one array per line. A
// listing that fails is reported on stderr and retried at the next tick; a
// backend that cannot list its locks ends the watch (exit 69).
func watchStatus(e *env, c *dlock.Client, out io.Writer, prefix string, asJSON bool, interval time.Duration) error {
	sigs, stopSigs := e.notify()
	defer stopSigs()
	var sc stopClient // for Ctrl-Z
	sc.set(c)
	tty := isTerminal(out)
	t := time.NewTicker(interval)
	defer t.Stop()
	for first := true; ; first = false {
		ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
		infos, err := inspect(ctx, c, prefix)
		cancel()
		switch {
		case errors.Is(err, errCannotList):
			return err
		case err != nil:
			e.warnf("%s", message(err))
		case asJSON:
			b, jerr := json.Marshal(toJSONAll(infos))
			if jerr != nil {
				return exitf(exitInternal, "status: writing JSON: %v", jerr)
			}
			fmt.Fprintf(out, "%s\n", b)
		default:
			stamp := time.Now().Format("15:04:05")
			switch {
			case tty:
				fmt.Fprintf(out, "\x1b[H\x1b[2JEvery %v: dlock status %s   %s\n\n", interval, prefix, stamp)
			case !first:
				fmt.Fprintf(out, "\n%s\n", stamp)
			default:
				fmt.Fprintf(out, "%s\n", stamp)
			}
			if werr := writeTable(out, infos); werr != nil {
				return werr
			}
		}
		select {
		case <-t.C:
		case s := <-sigs:
			for s == syscall.SIGTSTP || s == syscall.SIGCONT {
				if s == syscall.SIGTSTP {
					sc.stop(e)
				}
				s = <-sigs
			}
			return nil
		}
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}

// lockJSON is one element of "dlock status --json". The field names are a
// stable interface for scripts.
type lockJSON struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Owner       string `json:"owner"`
	Token       uint64 `json:"token"`
	Count       int    `json:"count"`
	ExpiresInMS *int64 `json:"expires_in_ms"`
	Waiters     *int   `json:"waiters"`
	Readers     int    `json:"readers"`
	Holders     int    `json:"holders"`
	Permits     int    `json:"permits"`
}

// lockType names a LockInfo's kind for status: a read/write lock is
// reported under its Write kind whichever side is held.
func lockType(li dlock.LockInfo) string {
	switch li.Kind {
	case driver.Read, driver.Write:
		return "rwlock"
	case driver.Permit:
		return "semaphore"
	}
	return "mutex"
}

// held reports whether anyone holds the lock.
func held(li dlock.LockInfo) bool { return li.Owner != "" || li.Readers > 0 || li.Holders > 0 }

func toJSON(li dlock.LockInfo) lockJSON {
	j := lockJSON{Name: li.Name, Type: lockType(li), Owner: li.Owner, Token: li.Token, Count: li.Count,
		Readers: li.Readers, Holders: li.Holders, Permits: li.Permits}
	if !held(li) {
		zero := int64(0)
		j.ExpiresInMS = &zero
	} else if li.ExpiresIn >= 0 {
		ms := li.ExpiresIn.Milliseconds()
		j.ExpiresInMS = &ms
	}
	if li.Waiters >= 0 {
		w := li.Waiters
		j.Waiters = &w
	}
	return j
}

func toJSONAll(infos []dlock.LockInfo) []lockJSON {
	out := make([]lockJSON, 0, len(infos))
	for _, li := range infos {
		out = append(out, toJSON(li))
	}
	return out
}

func writeJSON(w io.Writer, infos []dlock.LockInfo) error {
	out := toJSONAll(infos)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return exitf(exitInternal, "status: writing JSON: %v", err)
	}
	return nil
}

func writeTable(w io.Writer, infos []dlock.LockInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tHOLDER\tTOKEN\tEXPIRES-IN\tWAITERS")
	for _, li := range infos {
		typ, holder, expires := lockType(li), "-", "-"
		switch {
		case li.Kind == driver.Permit:
			typ += "/" + strconv.Itoa(li.Permits)
			if li.Holders > 0 {
				holder = fmt.Sprintf("%d of %d", li.Holders, li.Permits)
			}
		case li.Owner != "":
			holder = shorten(li.Owner, holderWidth)
			if li.Count > 1 {
				holder += " (x" + strconv.Itoa(li.Count) + ")"
			}
			holder = printable(holder)
		case li.Readers == 1:
			holder = "1 reader"
		case li.Readers > 1:
			holder = strconv.Itoa(li.Readers) + " readers"
		}
		if held(li) && li.ExpiresIn >= 0 {
			expires = roundDuration(li.ExpiresIn)
		}
		token := "-"
		if li.Token > 0 {
			token = strconv.FormatUint(li.Token, 10)
		}
		waiters := "-"
		if li.Waiters >= 0 {
			waiters = strconv.Itoa(li.Waiters)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(li.Name), typ, holder, token, expires, waiters)
	}
	if err := tw.Flush(); err != nil {
		return exitf(exitInternal, "status: writing table: %v", err)
	}
	return nil
}

// shorten cuts s to n bytes (owner ids are ASCII).
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// printable quotes a string that would break the table's layout.
func printable(s string) string {
	for _, r := range s {
		if r == '\t' || r == ' ' || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// roundDuration shows a remaining lease at a useful precision: milliseconds
// under a second, tenths of a second under a minute, seconds beyond.
func roundDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
