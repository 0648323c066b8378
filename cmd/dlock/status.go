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
	"github.com/spf13/cobra"
)

const statusLong = `Status lists the locks whose names start with PREFIX (all locks if omitted)
on the backend, with their holder and last fencing token:

  NAME        the lock's name
  HOLDER      the holder's owner id, shortened to 12 characters ("-" if free)
  TOKEN       the last fencing token granted for the name
  EXPIRES-IN  the holder's remaining lease ("-" if free or unknown, as on
              session-bound backends)
  WAITERS     processes waiting for it ("-" where the backend cannot tell)

--json prints an array of objects instead, for scripts:
  {"name": "...", "owner": "...", "token": 7, "count": 1,
   "expires_in_ms": 2900, "waiters": null}
owner is "" and count 0 when the lock is free; expires_in_ms and waiters are
null when unknown.

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
	Owner       string `json:"owner"`
	Token       uint64 `json:"token"`
	Count       int    `json:"count"`
	ExpiresInMS *int64 `json:"expires_in_ms"`
	Waiters     *int   `json:"waiters"`
}

func toJSON(li dlock.LockInfo) lockJSON {
	j := lockJSON{Name: li.Name, Owner: li.Owner, Token: li.Token, Count: li.Count}
	if li.Owner == "" {
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
	fmt.Fprintln(tw, "NAME\tHOLDER\tTOKEN\tEXPIRES-IN\tWAITERS")
	for _, li := range infos {
		holder, expires := "-", "-"
		if li.Owner != "" {
			holder = shorten(li.Owner, holderWidth)
			if li.Count > 1 {
				holder += " (x" + strconv.Itoa(li.Count) + ")"
			}
			if li.ExpiresIn >= 0 {
				expires = roundDuration(li.ExpiresIn)
			}
		}
		token := "-"
		if li.Token > 0 {
			token = strconv.FormatUint(li.Token, 10)
		}
		waiters := "-"
		if li.Waiters >= 0 {
			waiters = strconv.Itoa(li.Waiters)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", printable(li.Name), printable(holder), token, expires, waiters)
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
