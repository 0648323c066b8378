package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/spf13/cobra"
)

const releaseLong = `Release --force frees a lock that another process holds: an operator's
break-glass for a holder that is stuck but still renewing, or gone from a
backend whose lease is long. It releases only the grant whose fencing token
is --token (see "dlock status"), and refuses when the lock is free or held
with another token, so it never frees a holder that came after the one you
looked at.

The release is owner-checked on the backend: dlock reads the holder's owner
id with the token, and the backend frees the lock only if that owner still
holds it. A holder that re-entered the lock (a repeated --owner) has all its
holds given up. The process that held it is not told: its next renewal
finds the lease gone, and "dlock run" then stops its command (exit 76).

--type rwlock frees the writer of NAME's read/write lock. Read holders and
semaphore permits have no single token to name and are not released.

On etcd and ZooKeeper, where a grant lives in its client's session, the
holder's key or node is deleted in one step that checks the token (a
foreign holder's, such as etcdctl lock's or kazoo's, too). PostgreSQL and
MySQL in their session modes let only the holder's own connection release
it: release --force refuses there and says so (end the holder's process or
connection instead).

Exit codes:
  0    released; stdout says what
  1    nothing released: the lock is free, held with another token, or the
       backend refused (stderr says which)
  64   bad flag, argument or URL, or --force or --token missing
  69   backend unreachable or failing, or unable to list its locks`

// exitNothingReleased is release's exit code when it refused.
const exitNothingReleased = 1

// maxForcedHolds bounds how many holds of a re-entered grant release gives
// up before it stops.
const maxForcedHolds = 1000

func newReleaseCmd(e *env) *cobra.Command {
	var (
		src   urlFlags
		force bool
		token uint64
		typ   string
	)
	cmd := &cobra.Command{
		Use:   "release --force [flags] NAME --token T",
		Short: "Break-glass: free a lock another process holds, by its token",
		Long:  releaseLong,
		Example: `  dlock status deploy/          # note the TOKEN of the stuck holder
  dlock release --force deploy/prod --token 41`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("release: takes one lock NAME, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case !force:
				return usageErr(errors.New("release: freeing another process's lock needs --force (dlock run releases its own lock itself)"))
			case !cmd.Flags().Changed("token") || token == 0:
				return usageErr(errors.New("release: --token T is required: the fencing token of the grant to free, as dlock status shows it"))
			case typ != "mutex" && typ != "rwlock":
				return usageErr(fmt.Errorf("release: --type must be mutex or rwlock, got %q", typ))
			case args[0] == "":
				return usageErr(errors.New("release: the lock NAME is empty"))
			}
			return forceRelease(cmd, e, &src, args[0], typ, token)
		},
	}
	src.register(cmd, defaultURLHelp)
	src.registerConnect(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&force, "force", false, "required: free a lock that another process holds")
	fl.Uint64Var(&token, "token", 0, "the fencing token of the grant to free (required)")
	fl.StringVar(&typ, "type", "mutex", "which of NAME's locks: mutex, or rwlock (its writer)")
	return cmd
}

func forceRelease(cmd *cobra.Command, e *env, src *urlFlags, name, typ string, token uint64) error {
	raw, err := src.backendURL(e, "release")
	if err != nil {
		return err
	}
	reportBackend(e, raw, e.verbose)
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	d, _, err := openDriver(ctx, e, raw, src.connect)
	if err != nil {
		return err
	}
	defer d.Close()
	in, ok := d.(driver.Inspector)
	if !ok {
		return exitf(exitUnavailable, "release: this backend cannot list its locks, so the token cannot be checked; nothing released")
	}
	kind := driver.Exclusive
	if typ == "rwlock" {
		kind = driver.Write
	}
	breaker, _ := d.(driver.Breaker)
	released := 0
	var owner string
	for released < maxForcedHolds {
		infos, err := in.Inspect(ctx, name)
		if err != nil {
			return &exitError{code: exitUnavailable, err: fmt.Errorf("release: listing %q: %w", name, err)}
		}
		li, found := findLock(infos, name, typ)
		switch {
		case released > 0 && (!found || !held(li)):
			// Done: the last hold went with the previous call.
		case released > 0 && (li.Token != token || li.Owner != owner):
			e.warnf("dlock: %q is now held by a newer grant (token %d); left alone", name, li.Token)
		case !found || !held(li):
			return exitf(exitNothingReleased, "release: lock %q (%s) is free; nothing released", name, typ)
		case li.Token != token:
			return exitf(exitNothingReleased, "release: lock %q (%s) is held with token %d, not %d; nothing released", name, typ, li.Token, token)
		case li.Owner == "":
			return exitf(exitNothingReleased, "release: lock %q (%s) is held by readers or by a client whose owner id the backend does not show; nothing released", name, typ)
		case kind == driver.Exclusive && breaker != nil:
			// A session-bound grant: the backend removes it by its token.
			owner = li.Owner
			err := breaker.Break(ctx, name, token)
			switch {
			case errors.Is(err, dlock.ErrNotHeld):
				return exitf(exitNothingReleased, "release: %s; nothing released", trimDlock(err))
			case err != nil:
				return &exitError{code: exitUnavailable, err: fmt.Errorf("release %q: %w", name, err)}
			}
			released = li.Count
		default:
			owner = li.Owner
			remaining, err := d.Release(ctx, driver.Lease{Name: name, Owner: owner, Token: token, Kind: kind, TTL: max(li.ExpiresIn, 0)})
			switch {
			case errors.Is(err, dlock.ErrNotHeld) && released == 0:
				return exitf(exitNothingReleased, "release: the backend refused to release %q for owner %s: %s; nothing released (in PostgreSQL's and MySQL's session modes only the holder's own connection can release)",
					name, owner, trimDlock(err))
			case errors.Is(err, dlock.ErrNotHeld):
				// The remaining holds ended meanwhile.
			case err != nil:
				return &exitError{code: exitUnavailable, err: fmt.Errorf("release %q: %w", name, err)}
			default:
				released++
				if remaining > 0 {
					continue
				}
			}
		}
		break
	}
	holds := "1 hold"
	if released != 1 {
		holds = fmt.Sprintf("%d holds", released)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "released lock %q (%s, token %d, owner %s, %s)\n", name, typ, token, owner, holds)
	return nil
}

// trimDlock is err's message without dlock's prefixes.
func trimDlock(err error) string {
	s := message(err)
	return s[len("dlock: "):]
}
