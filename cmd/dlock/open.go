package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// connectParams are, per URL scheme, the parameter through which the
// driver's own connect timeout is set, and how a duration is written in it.
// --connect-timeout sets it when the URL does not: the driver then uses it
// for its first connection and for every reconnection, not just for Open.
// Schemes not listed (sqlite, mem, mysql, redlock) are bounded by the
// deadline on Open alone.
var connectParams = map[string]struct {
	name   string
	format func(time.Duration) string
}{
	"etcd":           {"dial_timeout", time.Duration.String},    // etcdlock: default 5s
	"etcds":          {"dial_timeout", time.Duration.String},    //
	"zk":             {"connect_timeout", time.Duration.String}, // zklock: default 10s
	"zks":            {"connect_timeout", time.Duration.String}, //
	"redis":          {"dial_timeout", time.Duration.String},    // go-redis: default 5s
	"rediss":         {"dial_timeout", time.Duration.String},    //
	"redis-sentinel": {"dial_timeout", time.Duration.String},    // go-redis failover client: default 5s
	"postgres":       {"connect_timeout", ceilSeconds},          // libpq/pgx: whole seconds
	"postgresql":     {"connect_timeout", ceilSeconds},          //
}

func ceilSeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}

// withConnectTimeout sets the scheme's connect-timeout parameter of raw to
// d, unless raw sets it already (the URL's own setting wins) or the scheme
// has none.
func withConnectTimeout(raw string, d time.Duration) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw // Open reports it
	}
	p, ok := connectParams[u.Scheme]
	if !ok || u.Query().Has(p.name) {
		return raw
	}
	sep := "&"
	if u.RawQuery == "" {
		sep = ""
	}
	u.RawQuery += sep + p.name + "=" + url.QueryEscape(p.format(d))
	return u.String()
}

// clientParams are the URL parameters that belong to the dlock Client
// rather than the driver (dlock.Open's list).
var clientParams = map[string]func(o *dlock.Options, v string) error{
	"ttl":             durationParam(func(o *dlock.Options) *time.Duration { return &o.TTL }),
	"renew_interval":  durationParam(func(o *dlock.Options) *time.Duration { return &o.RenewInterval }),
	"lock_delay":      durationParam(func(o *dlock.Options) *time.Duration { return &o.LockDelay }),
	"wait_min":        durationParam(func(o *dlock.Options) *time.Duration { return &o.WaitMin }),
	"wait_max":        durationParam(func(o *dlock.Options) *time.Duration { return &o.WaitMax }),
	"drift":           durationParam(func(o *dlock.Options) *time.Duration { return &o.Drift }),
	"release_timeout": durationParam(func(o *dlock.Options) *time.Duration { return &o.ReleaseTimeout }),
	"fail_fast": func(o *dlock.Options, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean: %q (use true or false)", v)
		}
		o.FailFast = b
		return nil
	},
}

func durationParam(field func(*dlock.Options) *time.Duration) func(*dlock.Options, string) error {
	return func(o *dlock.Options, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			// Plain seconds ("90", "0.5"), as dlock.Open takes them.
			f, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 366*24*3600 {
				return fmt.Errorf("not a duration: %q (use e.g. 30s, 500ms)", v)
			}
			d = time.Duration(f * float64(time.Second))
		}
		*field(o) = d
		return nil
	}
}

// splitClientParams takes the Client's parameters out of raw's query into
// Options, leaving the driver's.
func splitClientParams(raw string) (string, dlock.Options, error) {
	var o dlock.Options
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse echoes the input, password included: do not wrap it.
		return "", o, usageErr(errors.New("invalid url: cannot parse (check its form: scheme://host/path?params)"))
	}
	q := u.Query()
	found := false
	for name, set := range clientParams {
		vs, ok := q[name]
		if !ok {
			continue
		}
		found = true
		if len(vs) != 1 {
			return "", o, usageErr(fmt.Errorf("invalid url: parameter %s given %d times", name, len(vs)))
		}
		if err := set(&o, vs[0]); err != nil {
			return "", o, usageErr(fmt.Errorf("invalid url: parameter %s: %v", name, err))
		}
		q.Del(name)
	}
	if !found {
		return raw, o, nil
	}
	u.RawQuery = q.Encode()
	return u.String(), o, nil
}

// opened is a backend the command opened.
type opened struct {
	client *dlock.Client
}

// openBackend opens raw with dlock.OpenWith, the library's log records
// going to e's logger (renewal failures, retried attempts) and its events to
// hooks (nil: none), with connect as the bound on opening it and on the
// driver's own connection attempts where the driver has a setting for them
// (connectParams). connect 0 leaves each driver's default, and Open
// unbounded but for ctx.
func openBackend(ctx context.Context, e *env, raw string, connect time.Duration, hooks dlock.Hooks) (*opened, error) {
	if connect > 0 {
		raw = withConnectTimeout(raw, connect)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, connect)
		defer cancel()
	}
	start := time.Now()
	c, err := dlock.OpenWith(ctx, raw, &dlock.Options{Logger: e.clientLogger(), Hooks: hooks})
	if err != nil {
		code := classify(err)
		// Our deadline, or the driver's own timeout that we set.
		if code == exitUnavailable && connect > 0 && (ctx.Err() != nil || time.Since(start) >= connect*9/10) {
			return nil, exitf(exitUnavailable, "%s (no connection within --connect-timeout %v)", trimDlock(err), connect)
		}
		return nil, &exitError{code: code, err: err}
	}
	return &opened{client: c}, nil
}

// openDriver opens raw's driver alone, as openBackend does, and returns
// it with the Client options raw's query gives. The caller closes it.
func openDriver(ctx context.Context, e *env, raw string, connect time.Duration) (driver.Driver, dlock.Options, error) {
	driverURL, o, err := splitClientParams(raw)
	if err != nil {
		return nil, o, err
	}
	if err := o.Validate(); err != nil {
		return nil, o, usageErr(err)
	}
	if connect > 0 {
		driverURL = withConnectTimeout(driverURL, connect)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, connect)
		defer cancel()
	}
	start := time.Now()
	d, err := dlock.OpenDriver(ctx, driverURL)
	if err != nil {
		shown := "backend"
		if u, perr := url.Parse(raw); perr == nil {
			shown = openurl.RedactURL(u)
		}
		if errors.Is(err, dlock.ErrInvalid) || errors.Is(err, dlock.ErrUnsupported) {
			// As dlock.Open reports it: the URL is wrong.
			var ie *dlock.InvalidArgumentError
			if errors.As(err, &ie) {
				return nil, o, usageErr(err)
			}
			return nil, o, usageErr(fmt.Errorf("invalid url: %s: %w", shown, err))
		}
		// Our deadline, or the driver's own timeout that we set.
		if connect > 0 && (ctx.Err() != nil || time.Since(start) >= connect*9/10) {
			return nil, o, exitf(exitUnavailable, "open %s: no connection within --connect-timeout %v: %v", shown, connect, err)
		}
		return nil, o, exitf(exitUnavailable, "open %s: %v", shown, err)
	}
	return d, o, nil
}
