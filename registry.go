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

// OpenDriver opens the driver that rawURL names through its registered
// opener, with no Client around it, for drivers built over other drivers
// (package quorum opens its nodes this way). The caller owns the driver and
// closes it. The Client's parameters (ttl, lock_delay, …) belong to the
// Client over the outer driver and are refused here. Bad input is reported
// as by Open, wrapping ErrInvalid (an unknown scheme, a malformed URL, a
// parameter the driver refuses); no error carries the URL's secrets.
func OpenDriver(ctx context.Context, rawURL string) (driver.Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse echoes the input, password included: do not wrap it.
		return nil, invalid("url", "cannot parse (check its form: scheme://host/path?params)")
	}
	if u.Scheme == "" {
		return nil, invalid("url", "has no scheme (registered: %v)", Schemes())
	}
	open, err := lookupScheme(u.Scheme)
	if err != nil {
		return nil, err
	}
	for name := range u.Query() {
		if _, ok := clientParams[name]; ok {
			return nil, invalid("url", "parameter %s belongs to the Client, not to a driver opened on its own", name)
		}
	}
	d, err := open(ctx, u)
	if err != nil {
		return nil, redact(err, u)
	}
	return d, nil
}
