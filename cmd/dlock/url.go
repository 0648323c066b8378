package main

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/dlock/dlock"
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
// the password, and the values of query parameters that look like secrets
// (password=, sslpassword=, token=, ...; some drivers accept them). The
// library already redacts the password part of a URL; this is the second
// line of defence for everything dlock prints.
func (e *env) addSecrets(raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		return // the library never echoes a URL it cannot parse
	}
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			e.secrets = append(e.secrets, pw, url.PathEscape(pw), url.QueryEscape(pw))
		}
	}
	for _, kv := range strings.Split(u.RawQuery, "&") {
		k, v, _ := strings.Cut(kv, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			key = k
		}
		if !secretParam(key) || v == "" {
			continue
		}
		e.secrets = append(e.secrets, v)
		if dv, err := url.QueryUnescape(v); err == nil {
			e.secrets = append(e.secrets, dv)
		}
	}
}

func secretParam(key string) bool {
	key = strings.ToLower(key)
	for _, w := range []string{"pass", "pwd", "secret", "token", "credential", "auth"} {
		if strings.Contains(key, w) {
			return true
		}
	}
	return false
}

// scrub masks every remembered secret in s. Secrets shorter than four
// characters are left alone: masking every "ab" would garble the message
// while hiding little.
func (e *env) scrub(s string) string {
	for _, sec := range e.secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, "xxxxx")
		}
	}
	return s
}

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
