package main

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/openurl"
)

// backendURL picks the URL to open: the flag, else $DLOCK_URL, else the
// default SQLite file, whose directory it creates.
func backendURL(flag string, e *env) (string, error) {
	if flag != "" {
		e.addSecrets(flag)
		return flag, nil
	}
	if v := e.getenv("DLOCK_URL"); v != "" {
		e.addSecrets(v)
		return v, nil
	}
	path, err := defaultDBPath(e)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		// The path holds no secret; name it so the user can fix it.
		return "", exitf(exitUnavailable, "cannot create the state directory: %v (or set DLOCK_URL / --url)", err)
	}
	return sqliteURL(path), nil
}

// addSecrets remembers the secrets in a URL so that no message prints them:
// its password and the values of its secret query parameters (password=,
// sslpassword=, token=, ...; some drivers accept them), in every spelling,
// by the one rule of internal/openurl. The library already redacts the errors
// it returns; this is the second line of defence for everything dlock prints,
// and it also covers URLs the library cannot parse.
func (e *env) addSecrets(raw string) {
	e.secrets = append(e.secrets, openurl.SecretsOf(raw)...)
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
