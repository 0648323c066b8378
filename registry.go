package dlock

import (
	"context"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// URLOpener opens a driver from a URL. The URL's query holds only the
// driver's own parameters: the client-wide ones (ttl, lock_delay, …) have been
// taken out and applied to Options by Open. An opener must refuse a parameter
// it does not know with an error naming it, and reports every URL it refuses
// before connecting with an error wrapping driver.ErrInvalid, which Open
// turns into an *InvalidArgumentError for "url" (the dlock command exits 64
// on it, not 69 as for an unreachable backend). It must never put the URL's
// password or secret parameters into an error; Open masks them again in
// whatever it returns.
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

// redact hides a URL's secrets in err's message. Drivers should never echo
// them, but client libraries sometimes do; Open passes every error through
// this.
func redact(err error, u *url.URL) error { return openurl.RedactError(err, u) }
