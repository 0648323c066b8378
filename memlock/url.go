package memlock

import (
	"context"
	"net/url"
	"slices"
	"sync"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// Scheme is the URL scheme this package registers with dlock.
const Scheme = "mem"

func init() {
	dlock.Register(Scheme, OpenURL)
}

// OpenURL opens a driver for mem://NAME: a new client of the Backend that
// Named(NAME) returns, so that every URL with the same NAME (host and path)
// shares one in-process server. The URL takes no query parameters; any
// parameter is refused with an error naming it (wrapping driver.ErrInvalid).
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	if q := u.Query(); len(q) > 0 {
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return nil, openurl.BadURL("memlock: unknown URL parameter %q", keys[0])
	}
	return Named(u.Host + u.Path).NewDriver(), nil
}

var (
	namedMu sync.Mutex
	named   = map[string]*Backend{}
)

// Named returns the backend that mem://name URLs open, creating it if needed.
func Named(name string) *Backend {
	namedMu.Lock()
	defer namedMu.Unlock()
	b, ok := named[name]
	if !ok {
		b = NewBackend()
		named[name] = b
	}
	return b
}
