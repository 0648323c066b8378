package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/spf13/cobra"
)

const statusLong = `Status lists the locks whose names start with PREFIX (all locks if omitted)
on the backend, with their holder and last fencing token:

  NAME        the lock's name
  TYPE        mutex, rwlock (a read/write lock: dlock run --shared or
              --exclusive) or semaphore/N (N permits: dlock run --permits N)
  HOLDER      the holder's owner id, shortened to 12 characters; for a
              read/write lock held by readers "N readers", for a semaphore
              "H of N" permits taken ("-" if free)
  TOKEN       the last fencing token granted for the name and type
  EXPIRES-IN  the holder's remaining lease, the longest of several holders'
              ("-" if free or unknown, as on session-bound backends)
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
		src     urlFlags
		asJSON  bool
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "status [flags] [PREFIX]",
		Short: "List locks, their holders and tokens",
		Long:  statusLong,
		Example: `  dlock status
  dlock status --json orders/`,
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
			infos, err := inspect(e, &src, verbose, prefix)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), infos)
			}
			return writeTable(cmd.OutOrStdout(), infos)
		},
	}
	src.register(cmd, defaultURLHelp)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array for scripts")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print the backend (password masked) and whether its connection is TLS-verified on stderr")
	return cmd
}

func inspect(e *env, src *urlFlags, verbose bool, prefix string) ([]dlock.LockInfo, error) {
	raw, err := src.backendURL(e, "status")
	if err != nil {
		return nil, err
	}
	reportBackend(e, raw, verbose)
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	client, err := dlock.Open(ctx, raw)
	if err != nil {
		return nil, &exitError{code: classify(err), err: err}
	}
	defer client.Close()
	infos, err := client.Inspect(ctx, prefix)
	switch {
	case errors.Is(err, dlock.ErrUnsupported):
		return nil, exitf(exitUnavailable, "status: this backend cannot list its locks")
	case err != nil:
		return nil, &exitError{code: exitUnavailable, err: err}
	}
	return infos, nil
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

func writeJSON(w io.Writer, infos []dlock.LockInfo) error {
	out := make([]lockJSON, 0, len(infos))
	for _, li := range infos {
		out = append(out, toJSON(li))
	}
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
