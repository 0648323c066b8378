package dlock

import (
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strconv"
	"time"
)

// Defaults for Options and MutexOptions fields left zero.
const (
	// DefaultTTL is how long a lease lives without renewal.
	DefaultTTL = 30 * time.Second
	// DefaultWaitMin and DefaultWaitMax bound the randomised (full jitter)
	// backoff between attempts while Lock waits on a backend that cannot
	// notify waiters, or as the fallback when notification is silent.
	DefaultWaitMin = 5 * time.Millisecond
	DefaultWaitMax = time.Second
	// DefaultReleaseTimeout bounds Unlock, Extend and Close when the
	// caller's context has no deadline or has been cancelled.
	DefaultReleaseTimeout = 5 * time.Second

	minTTL       = 10 * time.Millisecond
	maxDuration  = 366 * 24 * time.Hour
	maxOwnerLen  = 128
	maxNameBytes = 255
)

// Options are a Client's defaults. The zero value (or nil) means every
// default. Each field but Logger and Hooks maps one-to-one onto a URL query
// parameter of Open, named in the field's comment.
type Options struct {
	// TTL is how long a lease lives on the server without renewal
	// (`ttl`, e.g. "30s"). Default DefaultTTL. A session-bound backend
	// (etcd, ZooKeeper, pinned SQL connections) may grant its session's
	// TTL instead.
	TTL time.Duration
	// RenewInterval is how often held leases are renewed (`renew_interval`).
	// Default TTL/3. Negative disables automatic renewal: the lease then
	// ends after TTL unless Extend is called.
	RenewInterval time.Duration
	// LockDelay keeps a lock unavailable this long after a holder's lease
	// ends without Unlock (expiry, session loss), as Chubby does
	// (`lock_delay`). Default 0. A clean Unlock frees the lock at once.
	LockDelay time.Duration
	// WaitMin and WaitMax bound the backoff between attempts while Lock
	// waits (`wait_min`, `wait_max`). Defaults DefaultWaitMin and
	// DefaultWaitMax. Each wait is drawn uniformly from [WaitMin, cap],
	// where cap doubles from WaitMin up to WaitMax, and is cut short by the
	// holder's remaining TTL when the backend reports it, or by a release
	// notification.
	WaitMin, WaitMax time.Duration
	// Drift is subtracted from every lease's local validity to allow for
	// clock rate differences between this process and the server (`drift`).
	// Default TTL/100 + 2ms, as in Redlock.
	Drift time.Duration
	// ReleaseTimeout bounds Unlock, Extend and Close, which run on a
	// context detached from the caller's (`release_timeout`). Default
	// DefaultReleaseTimeout.
	ReleaseTimeout time.Duration
	// FailFast makes a waiting Lock return the first backend error (as an
	// *OpError) instead of retrying it (`fail_fast`, "true" or "false").
	// Default false: Lock rides out transient backend failures, retrying
	// with backoff between WaitMin and WaitMax until ctx ends; see
	// Mutex.Lock.
	FailFast bool
	// Logger receives renewal failures, lease losses, retried lock attempts
	// and background releases. Default: none. Records carry the attributes
	// backend, name and, for a held lease, token; a renewal that fails
	// (or goes unanswered for a renewal interval) is logged at Warn, with
	// the attempt number and the time left before the lease's validity
	// deadline, before the lease is lost; a loss is logged at Error with
	// its cause. See docs/observability.md.
	Logger *slog.Logger
	// Hooks observes every operation, attempt, grant, renewal and loss of
	// the Client's locks, for metrics and tracing (packages dlockprom and
	// dlockotel; JoinHooks combines several). Default: none, which costs
	// nothing.
	Hooks Hooks
}

// MutexOptions are one lock's settings. Nil, or a zero field, takes the
// Client's Options.
type MutexOptions struct {
	// TTL overrides Options.TTL.
	TTL time.Duration
	// RenewInterval overrides Options.RenewInterval.
	RenewInterval time.Duration
	// LockDelay overrides Options.LockDelay. Use a negative value to ask
	// for no delay when the client default has one.
	LockDelay time.Duration
	// Owner names the holder explicitly: 1 to 128 printable ASCII
	// characters. Locking again with the same Owner (from this process or
	// another) re-enters the lock: the hold count goes up, the fencing token
	// stays the same, and each Unlock gives up one hold. Default: a random
	// 128-bit owner per lease, from crypto/rand, so leases never re-enter.
	Owner string
	// WaitMin and WaitMax override the client's backoff bounds.
	WaitMin, WaitMax time.Duration
	// FailFast makes Lock return the first backend error instead of
	// retrying it, as Options.FailFast does for the whole client. False
	// takes the client's setting.
	FailFast bool
}

// resolved holds the settings a Mutex uses, after defaults.
type resolved struct {
	ttl, renew, delay, drift, waitMin, waitMax time.Duration
	owner                                      string
	renewSet                                   bool // RenewInterval chosen explicitly
	failFast                                   bool
	generated                                  bool // owner generated for one acquire (set by acquire)
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.TTL == 0 {
		r.TTL = DefaultTTL
	}
	if r.WaitMin == 0 {
		r.WaitMin = DefaultWaitMin
	}
	if r.WaitMax == 0 {
		r.WaitMax = DefaultWaitMax
		if r.WaitMax < r.WaitMin {
			r.WaitMax = r.WaitMin
		}
	}
	if r.ReleaseTimeout == 0 {
		r.ReleaseTimeout = DefaultReleaseTimeout
	}
	return r
}

func checkDuration(arg string, d time.Duration, allowNegative bool) error {
	if d < 0 && !allowNegative {
		return invalid(arg, "must not be negative, got %v", d)
	}
	if d > maxDuration || d < -maxDuration {
		return invalid(arg, "must be at most %v, got %v", maxDuration, d)
	}
	return nil
}

// validate checks client options after defaults.
func (o *Options) validate() error {
	if o.TTL < minTTL {
		return invalid("TTL", "must be at least %v, got %v", minTTL, o.TTL)
	}
	for _, c := range []struct {
		arg string
		d   time.Duration
		neg bool
	}{{"TTL", o.TTL, false}, {"RenewInterval", o.RenewInterval, true}, {"LockDelay", o.LockDelay, false},
		{"WaitMin", o.WaitMin, false}, {"WaitMax", o.WaitMax, false}, {"Drift", o.Drift, false},
		{"ReleaseTimeout", o.ReleaseTimeout, false}} {
		if err := checkDuration(c.arg, c.d, c.neg); err != nil {
			return err
		}
	}
	if o.WaitMax < o.WaitMin {
		return invalid("WaitMax", "must not be below WaitMin (%v), got %v", o.WaitMin, o.WaitMax)
	}
	return nil
}

// resolve merges per-mutex options over the client's and validates them.
func (c *Client) resolve(mo *MutexOptions) (resolved, error) {
	co := &c.opts
	r := resolved{ttl: co.TTL, renew: co.RenewInterval, delay: co.LockDelay, drift: co.Drift,
		waitMin: co.WaitMin, waitMax: co.WaitMax}
	r.renewSet = co.RenewInterval != 0
	r.failFast = co.FailFast
	if mo != nil {
		r.failFast = r.failFast || mo.FailFast
		if err := checkDuration("TTL", mo.TTL, false); err != nil {
			return r, err
		}
		if err := checkDuration("RenewInterval", mo.RenewInterval, true); err != nil {
			return r, err
		}
		if err := checkDuration("LockDelay", mo.LockDelay, true); err != nil {
			return r, err
		}
		if err := checkDuration("WaitMin", mo.WaitMin, false); err != nil {
			return r, err
		}
		if err := checkDuration("WaitMax", mo.WaitMax, false); err != nil {
			return r, err
		}
		if mo.TTL != 0 {
			r.ttl = mo.TTL
			if co.Drift == 0 {
				r.drift = 0
			}
		}
		if mo.RenewInterval != 0 {
			r.renew, r.renewSet = mo.RenewInterval, true
		}
		if mo.LockDelay > 0 {
			r.delay = mo.LockDelay
		} else if mo.LockDelay < 0 {
			r.delay = 0
		}
		if mo.WaitMin != 0 {
			r.waitMin = mo.WaitMin
		}
		if mo.WaitMax != 0 {
			r.waitMax = mo.WaitMax
		}
		if mo.Owner != "" {
			if err := checkOwner(mo.Owner); err != nil {
				return r, err
			}
			r.owner = mo.Owner
		}
	}
	if r.ttl < minTTL {
		return r, invalid("TTL", "must be at least %v, got %v", minTTL, r.ttl)
	}
	if r.ttl < c.limits.MinTTL {
		return r, invalid("TTL", "must be at least %v on this backend, got %v", c.limits.MinTTL, r.ttl)
	}
	if g := c.limits.TTLGranularity; g > 0 && r.ttl%g != 0 {
		r.ttl = (r.ttl/g + 1) * g
	}
	if r.waitMax < r.waitMin {
		return r, invalid("WaitMax", "must not be below WaitMin (%v), got %v", r.waitMin, r.waitMax)
	}
	if r.waitMin <= 0 {
		return r, invalid("WaitMin", "must be positive, got %v", r.waitMin)
	}
	if r.drift == 0 {
		r.drift = defaultDrift(r.ttl)
	}
	if r.renewSet && r.renew > 0 && r.renew >= r.ttl-r.drift {
		return r, invalid("RenewInterval", "must be shorter than TTL minus drift (%v), got %v", r.ttl-r.drift, r.renew)
	}
	return r, nil
}

func defaultDrift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// clientParams are the URL query parameters Open applies to Options.
var clientParams = map[string]func(o *Options, v string) error{
	"ttl":             durParam(func(o *Options) *time.Duration { return &o.TTL }),
	"renew_interval":  durParam(func(o *Options) *time.Duration { return &o.RenewInterval }),
	"lock_delay":      durParam(func(o *Options) *time.Duration { return &o.LockDelay }),
	"wait_min":        durParam(func(o *Options) *time.Duration { return &o.WaitMin }),
	"wait_max":        durParam(func(o *Options) *time.Duration { return &o.WaitMax }),
	"drift":           durParam(func(o *Options) *time.Duration { return &o.Drift }),
	"release_timeout": durParam(func(o *Options) *time.Duration { return &o.ReleaseTimeout }),
	"fail_fast": func(o *Options, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean: %q (use true or false)", v)
		}
		o.FailFast = b
		return nil
	},
}

func durParam(field func(*Options) *time.Duration) func(*Options, string) error {
	return func(o *Options, v string) error {
		d, err := parseDuration(v)
		if err != nil {
			return err
		}
		*field(o) = d
		return nil
	}
}

// parseDuration accepts Go durations ("1m30s") and plain seconds ("90", "0.5").
func parseDuration(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > maxDuration.Seconds() {
		return 0, fmt.Errorf("not a duration: %q (use e.g. 30s, 500ms)", v)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// takeClientParams moves the client-wide parameters out of u's query into o.
func takeClientParams(u *url.URL, o *Options) error {
	q := u.Query()
	for name, set := range clientParams {
		vs, ok := q[name]
		if !ok {
			continue
		}
		if len(vs) != 1 {
			return invalid("url", "parameter %s given %d times", name, len(vs))
		}
		if err := set(o, vs[0]); err != nil {
			return invalid("url", "parameter %s: %v", name, err)
		}
		q.Del(name)
	}
	u.RawQuery = q.Encode()
	return nil
}
