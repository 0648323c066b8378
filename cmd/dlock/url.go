package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/spf13/cobra"
)

// urlFlags are the --url and --url-file flags of a command that opens a
// backend.
type urlFlags struct {
	url     string        // --url
	file    string        // --url-file
	connect time.Duration // --connect-timeout
}

// Variables that name the backend. They are dlock's own: "dlock run" does
// not pass them on to CMD (see childEnv).
const (
	envURL     = "DLOCK_URL"
	envURLFile = "DLOCK_URL_FILE"
	// envURLWithheld is set by "dlock run" in CMD's environment when it
	// left envURL or envURLFile out; see childEnv.
	envURLWithheld = "DLOCK_URL_WITHHELD"
)

// maxURLFileSize bounds what dlock reads from a URL file: it holds one URL.
const maxURLFileSize = 64 << 10

// register adds --url and --url-file to cmd; def describes the default.
func (u *urlFlags) register(cmd *cobra.Command, def string) {
	fl := cmd.Flags()
	fl.StringVar(&u.url, "url", "", "backend URL "+def+"; a password in it is visible to other users in ps: prefer --url-file")
	fl.StringVar(&u.file, "url-file", "", "read the backend URL from this file (one line; keep it mode 0600), so no password shows in ps")
}

// registerConnect adds --connect-timeout to cmd, whose backend is opened
// with open.
func (u *urlFlags) registerConnect(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&u.connect, "connect-timeout", 0, "give up (exit 69) if the backend cannot be reached within this time; also bounds the driver's reconnections where it has a setting (default: the driver's own, e.g. etcd 5s, ZooKeeper 10s)")
}

// open opens the backend raw names with the --connect-timeout bound.
func (u *urlFlags) open(ctx context.Context, e *env, raw string) (*opened, error) {
	return u.openHooked(ctx, e, raw, nil)
}

// openHooked is open with the library's Hooks (nil: none).
func (u *urlFlags) openHooked(ctx context.Context, e *env, raw string, hooks dlock.Hooks) (*opened, error) {
	if u.connect < 0 {
		return nil, usageErr(fmt.Errorf("--connect-timeout must not be negative, got %v", u.connect))
	}
	return openBackend(ctx, e, raw, u.connect, hooks)
}

// fromFlags returns the URL the flags give, "" if neither is set. cmdName
// prefixes its errors.
func (u *urlFlags) fromFlags(e *env, cmdName string) (string, error) {
	switch {
	case u.url != "" && u.file != "":
		return "", usageErr(fmt.Errorf("%s: give --url or --url-file, not both", cmdName))
	case u.file != "":
		return readURLFile(e, u.file, "--url-file")
	case u.url != "":
		e.addSecrets(u.url)
		if len(openurl.SecretsOf(u.url)) > 0 {
			e.warnf("dlock: warning: other users can read the password in --url (ps, /proc/PID/cmdline); give the URL with --url-file or $%s instead", envURLFile)
		}
		return u.url, nil
	}
	return "", nil
}

// backendURL picks the URL to open: --url or --url-file, else $DLOCK_URL or
// $DLOCK_URL_FILE, else the default SQLite file, whose directory it creates.
// Two sources at one level (both flags, or both variables) are refused
// rather than ranked, so that a forgotten one cannot silently win.
func (u *urlFlags) backendURL(e *env, cmdName string) (string, error) {
	if raw, err := u.fromFlags(e, cmdName); raw != "" || err != nil {
		return raw, err
	}
	v, file := e.getenv(envURL), e.getenv(envURLFile)
	switch {
	case v != "" && file != "":
		e.addSecrets(v)
		return "", usageErr(fmt.Errorf("both $%s and $%s are set: unset one", envURL, envURLFile))
	case file != "":
		return readURLFile(e, file, "$"+envURLFile)
	case v != "":
		e.addSecrets(v)
		return v, nil
	}
	if w := e.getenv(envURLWithheld); w != "" {
		// Under a "dlock run" whose backend came from the environment: the
		// default file is not that backend, so do not silently use it.
		return "", usageErr(fmt.Errorf("%s: no backend given, and the dlock run this runs under kept $%s from its command: give --url-file FILE or set $%s (or unset $%s to use the default SQLite file)", cmdName, strings.ReplaceAll(w, ",", " and $"), envURLFile, envURLWithheld))
	}
	path, err := defaultDBPath(e)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		// The path holds no secret; name it so the user can fix it.
		return "", exitf(exitUnavailable, "cannot create the state directory: %v (or give --url-file / $%s)", err, envURLFile)
	}
	return sqliteURL(path), nil
}

// readURLFile reads the backend URL from path, named in errors by from (the
// flag or variable that gave it). The file holds the URL on one line; a
// trailing newline and surrounding blanks are dropped. Errors name the file,
// never what it holds: a file that fails to read, is empty, too large or has
// more than one line is bad input (exit 64). A file that other users may read
// and whose URL has a password draws a warning, not a refusal: mounted secret
// files (container secrets) are often mode 0644 or 0444 inside a container of
// their own.
func readURLFile(e *env, path, from string) (string, error) {
	bad := func(format string, args ...any) error {
		return usageErr(fmt.Errorf("%s %q: "+format, append([]any{from, path}, args...)...))
	}
	f, err := os.Open(path)
	if err != nil {
		return "", bad("cannot read the URL file: %v", pathErrCause(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", bad("cannot read the URL file: %v", pathErrCause(err))
	}
	if !fi.Mode().IsRegular() && fi.Mode()&fs.ModeNamedPipe == 0 && fi.Mode()&fs.ModeCharDevice == 0 {
		return "", bad("not a regular file (%v)", fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxURLFileSize+1))
	if err != nil {
		return "", bad("cannot read the URL file: %v", pathErrCause(err))
	}
	// Whatever happens next, what the file holds is never printed.
	raw := strings.TrimSpace(string(b))
	e.addSecrets(raw)
	switch {
	case len(b) > maxURLFileSize:
		return "", bad("larger than %d KiB; it must hold only the backend URL", maxURLFileSize>>10)
	case raw == "":
		return "", bad("is empty; it must hold the backend URL on one line")
	case strings.ContainsAny(raw, "\r\n"):
		return "", bad("has more than one line; it must hold only the backend URL")
	case !strings.Contains(raw, "://"):
		// Not a URL (a bare password, say): hide all of it from any error.
		e.addSecretText(raw)
	}
	if fi.Mode().Perm()&0o077 != 0 && len(openurl.SecretsOf(raw)) > 0 {
		e.warnf("dlock: warning: %s %q holds a password and other users may read it (mode %04o); chmod 600 it", from, path, fi.Mode().Perm())
	}
	return raw, nil
}

// pathErrCause drops the path that an *fs.PathError repeats, since the
// caller names the file already.
func pathErrCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// addSecrets remembers the secrets in a URL so that no message prints them:
// its password and the values of its secret query parameters (password=,
// sslpassword=, token=, ...; some drivers accept them), in every spelling,
// by the one rule of internal/openurl. The library already redacts the errors
// it returns; this is the second line of defence for everything dlock prints,
// and it also covers URLs the library cannot parse.
func (e *env) addSecrets(raw string) {
	e.addSecretText(openurl.SecretsOf(raw)...)
}

// addSecretText remembers secrets as they are: strings never to print.
func (e *env) addSecretText(secrets ...string) {
	e.secrets = append(e.secrets, secrets...)
	// Longest first, so that masking one cannot leave part of another.
	slices.SortStableFunc(e.secrets, func(a, b string) int { return len(b) - len(a) })
}

// scrub masks every remembered secret in s, whatever its length: a short
// password is still a password.
func (e *env) scrub(s string) string { return openurl.Scrub(s, e.secrets) }

// defaultDBPath is $XDG_STATE_HOME/dlock/locks.db, or
// $HOME/.local/state/dlock/locks.db when XDG_STATE_HOME is unset or not
// absolute (the XDG Base Directory spec says to ignore relative values).
func defaultDBPath(e *env) (string, error) {
	if d := e.getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "dlock", "locks.db"), nil
	}
	home := e.getenv("HOME")
	if !filepath.IsAbs(home) {
		return "", usageErr(errors.New("no state directory for the default lock database: set HOME or XDG_STATE_HOME, or give --url / $DLOCK_URL"))
	}
	return filepath.Join(home, ".local", "state", "dlock", "locks.db"), nil
}

// sqliteURL turns an absolute file path into a sqlite:// URL: an empty host
// and the path escaped, so spaces, '?', '#' and '%' survive the round trip
// (sqlite:///home/a%20b/locks.db).
func sqliteURL(absPath string) string {
	u := url.URL{Scheme: "sqlite", Path: filepath.ToSlash(absPath)}
	return u.String()
}

// schemeList lists the registered URL schemes for help text.
func schemeList() string {
	s := dlock.Schemes()
	for i, v := range s {
		s[i] = v + "://"
	}
	return strings.Join(s, ", ")
}

// defaultURLHelp describes, in a flag's help, where the URL comes from when
// no flag gives it.
const defaultURLHelp = "(default $DLOCK_URL or $DLOCK_URL_FILE, else sqlite in $XDG_STATE_HOME/dlock/locks.db)"
