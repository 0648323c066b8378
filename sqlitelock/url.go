package sqlitelock

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// Scheme is the URL scheme this package registers with dlock.
const Scheme = "sqlite"

func init() {
	dlock.Register(Scheme, OpenURL)
}

// OpenURL opens the driver a sqlite:// URL describes (see the package doc):
// the file's path, and Options as query parameters (table, busy_timeout).
// A malformed URL, or an unknown, repeated or bad parameter, is refused
// with an error naming it that wraps driver.ErrInvalid.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	path, err := urlPath(u)
	if err != nil {
		return nil, err
	}
	opts, err := urlOptions(u.Query())
	if err != nil {
		return nil, err
	}
	return openPath(ctx, path, opts)
}

// urlPath extracts the file path: sqlite:///abs/x.db is absolute,
// sqlite://rel/x.db and sqlite:rel/x.db are relative to the working
// directory.
func urlPath(u *url.URL) (string, error) {
	if u.Scheme != Scheme {
		return "", openurl.BadURL("sqlitelock: URL scheme is %q, want %q", u.Scheme, Scheme)
	}
	if u.User != nil {
		return "", openurl.BadURL("sqlitelock: a sqlite URL takes no user name or password")
	}
	if u.Fragment != "" {
		return "", openurl.BadURL("sqlitelock: a sqlite URL takes no #fragment (write # in a path as %%23)")
	}
	var path string
	switch {
	case u.Opaque != "":
		p, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return "", openurl.BadURL("sqlitelock: bad path in URL: %v", err)
		}
		path = p
	case u.Host == "":
		path = u.Path
	default:
		if u.Port() != "" {
			return "", openurl.BadURL("sqlitelock: a sqlite URL names a file, not a server: host %q has a port (for an absolute path write sqlite:///path)", u.Host)
		}
		path = u.Host + u.Path
	}
	if path == "" || path == "/" {
		return "", openurl.BadURL("sqlitelock: the sqlite URL has no file path (e.g. sqlite:///var/lib/app/locks.db)")
	}
	return path, nil
}

func urlOptions(q url.Values) (*Options, error) {
	var unknown []string
	for k, v := range q {
		switch k {
		case "table", "busy_timeout":
			if len(v) != 1 {
				return nil, openurl.BadURL("sqlitelock: URL parameter %q given %d times", k, len(v))
			}
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, openurl.BadURL("sqlitelock: unknown URL parameter(s) %s (known: table, busy_timeout)", strings.Join(quoteAll(unknown), ", "))
	}
	o := &Options{Table: q.Get("table")}
	if _, ok := q["table"]; ok && o.Table == "" {
		return nil, openurl.BadURL("sqlitelock: URL parameter \"table\" is empty")
	}
	if s, ok := q["busy_timeout"]; ok {
		d, err := time.ParseDuration(s[0])
		if err != nil {
			return nil, openurl.BadURL("sqlitelock: URL parameter \"busy_timeout\": %q is not a duration such as 5s", s[0])
		}
		if d < 0 {
			return nil, openurl.BadURL("sqlitelock: URL parameter \"busy_timeout\": %v is negative", d)
		}
		o.BusyTimeout = d
	}
	if _, _, err := o.resolve(); err != nil {
		return nil, err
	}
	return o, nil
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
