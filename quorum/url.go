package quorum

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// Scheme is the URL scheme this package registers with dlock:
// quorum:?node=URL1&node=URL2&node=URL3[&node_timeout=D].
const Scheme = "quorum"

func init() {
	dlock.Register(Scheme, OpenURL)
}

// noFence lists the registered schemes whose drivers cannot raise their
// fencing counter, so that such a node is refused even when it is down at
// open.
var noFence = map[string]bool{"etcd": true, "etcds": true, "zk": true, "zks": true}

// OpenURL opens a driver for quorum:?node=URL1&node=URL2&node=URL3, one
// node= parameter per node, each the node's own dlock URL query-escaped
// (url.QueryEscape), of any registered scheme whose driver can raise its
// fencing counter; import each node's driver package. Each node is opened
// through the registry (dlock.OpenDriver) and closed by the driver's Close.
// Parameter node_timeout sets Options.NodeTimeout; the Client's parameters
// (ttl, lock_delay, …) go on the quorum: URL, not on a node's. A majority
// of nodes must open (a node's opener connects, or fails); a node that
// cannot be reached counts as a failing node, and calls try to open it
// again (at most once a second) until it opens. Fewer than a majority fails
// the open, naming the nodes.
//
// Bad input is refused with an error wrapping driver.ErrInvalid that names
// the node at fault: fewer than 3 nodes, a node URL that does not parse or
// that its driver refuses, a node given twice (the same URL, or the same
// server: nodes must be independent), an unknown parameter; a node whose
// driver cannot raise its fencing counter (etcd, ZooKeeper) with one
// wrapping driver.ErrUnsupported. No error carries a node's password or
// secret parameters.
func OpenURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	raws, o, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(raws))
	for i, raw := range raws {
		nu, _ := url.Parse(raw) // parseURL checked it
		names[i] = openurl.RedactURL(nu)
	}
	o.Names = names
	drivers := make([]driver.Driver, len(raws))
	errs := make([]error, len(raws))
	var wg sync.WaitGroup
	for i, raw := range raws {
		wg.Go(func() {
			drivers[i], errs[i] = dlock.OpenDriver(ctx, raw)
		})
	}
	wg.Wait()
	var bad, down []error
	for i, err := range errs {
		if err == nil {
			continue
		}
		err = fmt.Errorf("node %d (%s): %w", i, names[i], openurl.ScrubError(err, openurl.SecretsOf(raws[i])))
		nu, _ := url.Parse(raws[i])
		switch {
		case errors.Is(err, driver.ErrInvalid) || errors.Is(err, driver.ErrUnsupported):
			bad = append(bad, err)
		case noFence[strings.ToLower(nu.Scheme)]:
			bad = append(bad, fmt.Errorf("node %d (%s): %s nodes cannot raise their fencing counter (their tokens are server revisions): %w", i, names[i], nu.Scheme, driver.ErrUnsupported))
		default:
			down = append(down, err)
		}
	}
	closeAll := func() {
		for _, d := range drivers {
			if d != nil {
				_ = d.Close()
			}
		}
	}
	if len(bad) > 0 {
		closeAll()
		return nil, fmt.Errorf("quorum: %w", errors.Join(bad...))
	}
	if quorum := len(raws)/2 + 1; len(raws)-len(down) < quorum {
		closeAll()
		return nil, fmt.Errorf("quorum: %d of %d nodes could not be opened, a quorum is %d: %w", len(down), len(raws), quorum, errors.Join(down...))
	}
	// A majority opened: the others count as failing nodes until a call
	// manages to open them.
	for i, err := range errs {
		if err != nil {
			drivers[i] = newLazyNode(raws[i], names[i], openurl.ScrubError(err, openurl.SecretsOf(raws[i])))
		}
	}
	return New(drivers, o)
}

// parseURL returns the node URLs and the Options of a quorum: URL. Its
// errors wrap driver.ErrInvalid and carry no secrets.
func parseURL(u *url.URL) ([]string, *Options, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.Opaque != "" || u.User != nil {
		return nil, nil, openurl.BadURL("quorum: the nodes go in node= parameters, not in the URL's host or path: quorum:?node=URL1&node=URL2&node=URL3 (each URL query-escaped)")
	}
	q := u.Query()
	o := &Options{}
	raws := q["node"]
	q.Del("node")
	if v, ok := q["node_timeout"]; ok {
		t, err := time.ParseDuration(v[len(v)-1])
		if err != nil || t <= 0 {
			return nil, nil, openurl.BadURL("quorum: URL parameter node_timeout: want a positive duration such as 100ms, got %q", v[len(v)-1])
		}
		o.NodeTimeout = t
		q.Del("node_timeout")
	}
	if len(q) > 0 {
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return nil, nil, openurl.BadURL("quorum: unknown URL parameter %q (the quorum: URL takes node= and node_timeout; a node's own parameters go inside its escaped URL)", keys[0])
	}
	if len(raws) < MinNodes {
		return nil, nil, openurl.BadURL("quorum: %d node= parameters, at least %d are needed (an odd number: N nodes tolerate (N-1)/2 failures)", len(raws), MinNodes)
	}
	type seenNode struct {
		i    int
		name string
	}
	seen := map[string]seenNode{}
	for i, raw := range raws {
		nu, err := url.Parse(raw)
		if err != nil || nu.Scheme == "" {
			// url.Parse echoes the input, password included.
			return nil, nil, openurl.BadURL("quorum: node %d: not a URL with a scheme (check its form, scheme://host/path?params, and that it is query-escaped in the quorum: URL)", i)
		}
		name := openurl.RedactURL(nu)
		k := identity(nu)
		if prev, dup := seen[k]; dup {
			return nil, nil, openurl.BadURL("quorum: node %d (%s) is the same as node %d (%s): nodes must be independent servers or files", i, name, prev.i, prev.name)
		}
		seen[k] = seenNode{i, name}
	}
	return raws, o, nil
}

// identity is what makes two node URLs the same node: the server (host and
// port, whatever the scheme, database or path) when the URL names one, else
// the path and query (an SQLite file, a memlock name).
func identity(u *url.URL) string {
	if u.Host != "" {
		return "host:" + strings.ToLower(u.Host)
	}
	return "path:" + u.Opaque + u.Path + "?" + u.Query().Encode()
}
