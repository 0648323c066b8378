// Package openurl is the one place where dlock decides what in a backend URL
// is secret, hides it, and reports a URL as bad input. The dlock package's
// Open, every driver's URL opener, the SQL drivers' connection errors and the
// dlock command all use it, so that one rule applies everywhere (as gocloud's
// internal/openurl does for its URL openers).
//
// # What is secret
//
// The password of the URL's userinfo, and the value of every query parameter
// whose name is a credential (SecretParam). Every occurrence of a secret is
// masked, whatever its length: a rule that spares short values ("only mask 3
// characters or more") leaks short passwords. Each secret is hidden in the
// forms in which a URL's text carries it: as given, path-escaped,
// query-escaped, userinfo-escaped, and as spelled in the URL's raw query.
//
// The user name is not secret, and neither is a parameter that names a file
// holding a credential (key_file, sslkey, sslcert): that is a path, which the
// user needs to see to fix a mistake.
package openurl

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/dlock/dlock/driver"
)

// Mask replaces every secret in text that dlock prints.
const Mask = "xxxxx"

// secretSuffixes are the words that end the name of a parameter that carries
// a credential, compared after lower-casing the name and dropping '_', '-'
// and '.'. The names that end in them include password, sslpassword, passwd,
// pass, pwd, secret, client_secret, token, auth_token, access_token, auth,
// credentials, api_key, auth_key, access_key, secret_key.
//
// "key" alone is not on the list: it ends key_file and sslkey (paths to a
// key, not the key) and key_prefix (a namespace), whose values the user needs
// to see. Only the compounds that name a key that is itself the credential
// (apikey, authkey, accesskey, secretkey, privatekey) are.
var secretSuffixes = []string{
	"password", "passwd", "pass", "pwd",
	"secret", "token", "auth", "credential", "credentials",
	"apikey", "authkey", "accesskey", "secretkey", "privatekey",
}

// SecretParam reports whether a URL query parameter named name carries a
// secret, by the rule in the package doc. It is case-insensitive and ignores
// '_', '-' and '.' in the name, so "sslpassword", "auth_token" and "API-Key"
// are secret, while "key_file", "key_prefix" and "allowCleartextPasswords"
// (a boolean) are not.
func SecretParam(name string) bool {
	n := strings.Map(func(r rune) rune {
		switch r {
		case '_', '-', '.':
			return -1
		}
		return r
	}, strings.ToLower(name))
	for _, s := range secretSuffixes {
		if strings.HasSuffix(n, s) {
			return true
		}
	}
	return false
}

// Secrets returns the secrets in u (its password, the values of secret
// query parameters, and those of URLs given as query values, such as the
// quorum driver's node=…) in every form in which text derived from u may carry
// them, longest first, without duplicates or empty strings. A nil u has none.
func Secrets(u *url.URL) []string {
	var c collector
	if u != nil {
		if u.User != nil {
			if pw, ok := u.User.Password(); ok {
				c.addPassword(pw)
			}
		}
		c.addQuery(u.RawQuery)
	}
	return c.sorted()
}

// SecretsOf is Secrets for a URL as the user typed it: it adds the password
// as spelled in rawURL, and still finds the password and the secret
// parameters of a URL that url.Parse refuses (whose text a library might
// echo all the same).
func SecretsOf(rawURL string) []string {
	var c collector
	if u, err := url.Parse(rawURL); err == nil {
		c.add(Secrets(u)...)
	}
	if _, rest, ok := strings.Cut(rawURL, "://"); ok {
		authority := rest
		if i := strings.IndexAny(authority, "/?#"); i >= 0 {
			authority = authority[:i]
		}
		if i := strings.LastIndex(authority, "@"); i >= 0 {
			if _, pw, ok := strings.Cut(authority[:i], ":"); ok {
				c.add(pw)
				if dpw, err := url.PathUnescape(pw); err == nil {
					c.addPassword(dpw)
				}
			}
		}
	}
	if _, query, ok := strings.Cut(rawURL, "?"); ok {
		query, _, _ = strings.Cut(query, "#")
		c.addQuery(query)
	}
	return c.sorted()
}

// collector gathers secrets without duplicates or empty strings.
type collector struct{ out []string }

func (c *collector) add(forms ...string) {
	for _, f := range forms {
		if f != "" && !slices.Contains(c.out, f) {
			c.out = append(c.out, f)
		}
	}
}

// addPassword adds a userinfo password in the forms a URL's text carries it.
func (c *collector) addPassword(pw string) {
	userinfo := strings.TrimPrefix(url.UserPassword("", pw).String(), ":")
	c.add(pw, userinfo, url.PathEscape(pw), url.QueryEscape(pw))
}

// addQuery adds the values of a raw query's secret parameters: as the user
// spelled them (%2d and %2D alike, which is what a library that echoes the
// URL prints), decoded, and escaped again.
func (c *collector) addQuery(rawQuery string) {
	if rawQuery == "" {
		return
	}
	for _, kv := range strings.Split(rawQuery, "&") {
		k, v, _ := strings.Cut(kv, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if !SecretParam(name) {
			// A value that is itself a URL (quorum:?node=redis://u:pw@h)
			// carries that URL's secrets, escaped once more.
			if dv, err := url.QueryUnescape(v); err == nil && strings.Contains(dv, "://") {
				for _, sec := range SecretsOf(dv) {
					c.add(sec, url.QueryEscape(sec))
				}
			}
			continue
		}
		c.add(v)
		if dv, err := url.QueryUnescape(v); err == nil {
			c.add(dv, url.QueryEscape(dv), url.PathEscape(dv))
		}
	}
}

// sorted returns the secrets longest first, so that masking one form cannot
// leave part of a longer one behind.
func (c *collector) sorted() []string {
	slices.SortStableFunc(c.out, func(a, b string) int { return len(b) - len(a) })
	return c.out
}

// Scrub returns s with every occurrence of each of secrets replaced by Mask.
// Give it secrets ordered longest first, as Secrets returns them.
func Scrub(s string, secrets []string) string {
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, Mask)
		}
	}
	return s
}

// RedactURL returns u as text for logs and errors, with its password and the
// values of its secret query parameters replaced by Mask, and URLs given as
// query values redacted in turn. The other parameters keep their order and
// spelling.
func RedactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	r := *u
	if r.User != nil {
		if _, ok := r.User.Password(); ok {
			r.User = url.UserPassword(r.User.Username(), Mask)
		}
	}
	if r.RawQuery != "" {
		pairs := strings.Split(r.RawQuery, "&")
		for i, kv := range pairs {
			k, v, hasValue := strings.Cut(kv, "=")
			name, err := url.QueryUnescape(k)
			if err != nil {
				name = k
			}
			if hasValue && SecretParam(name) {
				pairs[i] = k + "=" + Mask
			} else if v, err := url.QueryUnescape(v); err == nil && strings.Contains(v, "://") {
				// A nested URL (quorum:?node=…) is shown redacted in turn.
				if nu, err := url.Parse(v); err == nil {
					pairs[i] = k + "=" + url.QueryEscape(RedactURL(nu))
				} else {
					pairs[i] = k + "=" + Mask
				}
			}
		}
		r.RawQuery = strings.Join(pairs, "&")
	}
	return r.String()
}

// RedactError returns err with u's secrets (see Secrets) masked in its text;
// errors.Is and errors.As still see err and everything it wraps. It returns
// err itself when its text holds none of them, and nil for a nil err. Client
// libraries sometimes echo a connection string in their errors: openers pass
// such errors through RedactError before returning them.
func RedactError(err error, u *url.URL) error {
	return ScrubError(err, Secrets(u))
}

// ScrubError is RedactError for secrets already collected (see Secrets).
func ScrubError(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := Scrub(msg, secrets); red != msg {
		return &redactedError{msg: red, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Error is bad input to an opener: a malformed URL, an unknown parameter, a
// bad parameter value. It wraps driver.ErrInvalid (so dlock.Open reports it as
// an invalid argument and the dlock command exits 64) and the error it was
// built from, if any.
type Error struct {
	// Arg names the bad argument: "url" for BadURL.
	Arg string
	err error
}

// Error returns the reason as the opener wrote it; dlock.Open adds the
// argument's name and the redacted URL in front.
func (e *Error) Error() string { return e.err.Error() }

// Unwrap returns driver.ErrInvalid and the error the reason was built from.
func (e *Error) Unwrap() []error { return []error{driver.ErrInvalid, e.err} }

// Invalid returns an *Error for argument arg whose text is
// fmt.Sprintf(format, args...); a %w verb keeps the wrapped error in the
// chain. The text must not contain secrets: pass anything that may hold one
// through RedactError first.
func Invalid(arg, format string, args ...any) error {
	return &Error{Arg: arg, err: fmt.Errorf(format, args...)}
}

// BadURL is Invalid("url", format, args...): what a URL opener returns for a
// URL it refuses before connecting.
func BadURL(format string, args ...any) error {
	return Invalid("url", format, args...)
}
