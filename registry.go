package dlock

import (
	"context"

	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/dlock/dlock/driver"
)

// URLOpener opens a driver from a URL. The URL's query holds only the
// driver's own parameters: the client-wide ones (ttl, lock_delay, …) have been
// taken out and applied to Options by Open. An opener must refuse a parameter
// it does not know with an error naming it, and must never put the URL's
// password into an error.
type URLOpener func(ctx context.Context, u *url.URL) (driver.Driver, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]URLOpener{}
)

// Register makes a driver available under a URL scheme. Drivers call it from
// init. Registering the same scheme twice, or a nil opener, panics.
func Register(scheme string, open URLOpener) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if open == nil {
		panic("dlock: Register opener is nil")
	}
	if _, dup := registry[scheme]; dup {
		panic("dlock: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

func lookupScheme(scheme string) (URLOpener, error) {
	registryMu.RLock()
	open := registry[scheme]
	registryMu.RUnlock()
	if open != nil {
		return open, nil
	}
	return nil, invalid("url", "unknown scheme %q (registered: %s; forgotten import of the driver package, e.g. _ \"github.com/dlock/dlock/%slock\"?)",
		scheme, strings.Join(Schemes(), ", "), scheme)
}

// secretParam reports whether a URL query parameter carries a secret.
func secretParam(key string) bool {
	k := strings.ToLower(key)
	for _, w := range []string{"pass", "pwd", "secret", "token", "credential", "auth", "key"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// secrets returns the secret strings in u: its password and the values of
// query parameters that look like secrets (password=, sslpassword=, …).
func secrets(u *url.URL) []string {
	var out []string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			out = append(out, pw)
		}
	}
	for k, vs := range u.Query() {
		if !secretParam(k) {
			continue
		}
		for _, v := range vs {
			if len(v) >= 3 {
				out = append(out, v)
			}
		}
	}
	return out
}

// RedactURL returns u as text with its password and secret-looking query
// parameter values replaced by "xxxxx", for logs and errors.
func RedactURL(u *url.URL) string {
	r := *u
	if r.User != nil {
		if _, ok := r.User.Password(); ok {
			r.User = url.UserPassword(r.User.Username(), "xxxxx")
		}
	}
	q := r.Query()
	changed := false
	for k := range q {
		if secretParam(k) {
			q[k] = []string{"xxxxx"}
			changed = true
		}
	}
	if changed {
		r.RawQuery = q.Encode()
	}
	return r.String()
}

// redact hides a URL's secrets in err's message. Drivers should never echo
// them, but client libraries sometimes do; Open passes every error through
// this.
func redact(err error, u *url.URL) error {
	if err == nil || u == nil {
		return err
	}
	msg := err.Error()
	var found []string
	for _, s := range secrets(u) {
		if strings.Contains(msg, s) {
			found = append(found, s)
		}
	}
	if len(found) == 0 {
		return err
	}
	return &redactedError{err: err, secrets: found}
}

type redactedError struct {
	err     error
	secrets []string
}

func (e *redactedError) Error() string {
	msg := e.err.Error()
	for _, s := range e.secrets {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return msg
}

func (e *redactedError) Unwrap() error { return e.err }

// RedactError is for URLOpeners: it returns err with u's password and the
// values of secret-looking query parameters replaced by "xxxxx" in its text
// (errors.Is and errors.As still see the original). Client libraries
// sometimes echo a connection string in their errors.
func RedactError(err error, u *url.URL) error { return redact(err, u) }

// BadURL is for URLOpeners: it reports a malformed URL, an unknown parameter
// or a bad parameter value as an *InvalidArgumentError naming "url", so that
// callers (and the dlock command's exit code) can tell bad input from an
// unreachable backend. The message must not contain secrets.
func BadURL(format string, args ...any) error {
	return invalid("url", format, args...)
}
