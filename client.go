package dlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// Client hands out locks on one backend. It owns the driver it was given:
// its renewal goroutine renews every lease it granted, batched into one
// driver call per tick, and Close releases them all. Holding many leases
// does not slow the others down: a grant, a release and a renewal each cost
// O(log n) in the number of leases held, and no work walks them all.
//
// A Client is safe for concurrent use. Create one per backend and share it;
// each Client is a separate session to the backend.
type Client struct {
	d       driver.Driver
	opts    Options // with defaults
	log     *slog.Logger
	hooks   Hooks  // nil when none
	backend string // Backend()
	limits  driver.Limits
	// defaults are the settings of a lock made without MutexOptions
	// (resolve(nil)), which every such Mutex shares, and defaultsErr the
	// error resolve(nil) gives.
	defaults    resolved
	defaultsErr error

	epoch time.Time // zero of the Client's clock (see Client.now)

	mu     sync.Mutex
	closed atomic.Bool // set under mu, read without it by isClosed
	// heaps schedule the renewals and validity deadlines of the leases the
	// Client holds (see renew.go); every one is in heaps[byDeadline].
	heaps   [nHeaps]leaseHeap
	renewer sleeper
	reaper  sleeper
	// lostWatch holds one goroutine per distinct driver loss channel
	// (usually one per session), not one per lease; it stops when its last
	// lease ends, except the one of idleLost.
	lostWatch map[<-chan struct{}]*lostWatcher
	// idleLost is the loss channel whose last lease ended most recently:
	// its watcher is kept (in lostWatch, with no lease) for the next grant
	// on the same channel, so that Lock+Unlock cycles on one session do not
	// start a goroutine and wake it to stop each time. It stops when another
	// channel's watcher goes idle, when its channel closes, or on Close.
	idleLost <-chan struct{}
	// retries holds the releases whose outcome was unknown and that are
	// being retried in the background (see retryRelease).
	retries map[*releaseRetry]struct{}
	retryWG sync.WaitGroup
	// acquiring counts the acquires under way (Mutex.acquireOp), so that
	// Close can let those whose attempt was in flight release what it
	// granted before the driver is closed; the last to finish once the
	// Client is closed signals idle.
	acquiring atomic.Int64
	idle      chan struct{}

	closing chan struct{}
	// ended is closed once Close has ended every lease: the reaper keeps
	// ending leases whose deadline passes while Close releases them.
	ended    chan struct{}
	closeCtx context.Context // cancelled when Close starts
	stopCtx  context.CancelFunc
	wg       sync.WaitGroup
	closeErr error
	once     sync.Once
}

// Open connects to the backend named by rawURL, whose scheme selects a
// registered driver (import the driver package for its side effect, e.g.
// _ "github.com/dlock/dlock/redislock"). Query parameters ttl,
// renew_interval, lock_delay, wait_min, wait_max, drift, release_timeout and
// fail_fast set the Client's Options; the rest belong to the driver, which refuses any
// it does not know. A malformed URL, an unknown parameter or a bad value is
// reported as an *InvalidArgumentError (wrapping ErrInvalid); a backend that
// cannot be reached as an *OpError. Errors never contain the URL's password
// or the values of secret-looking query parameters (password=, …).
// OpenWith also takes the Options a URL cannot carry (Logger, Hooks).
func Open(ctx context.Context, rawURL string) (*Client, error) {
	return OpenWith(ctx, rawURL, nil)
}

// OpenWith is Open with Options to start from: the URL's query parameters
// (ttl, lock_delay, …) override the fields they name, and the fields that
// have no parameter (Logger, Hooks) are taken from opts. opts may be nil.
//
//	client, err := dlock.OpenWith(ctx, "redis://localhost:6379/0", &dlock.Options{Hooks: metrics, Logger: slog.Default()})
func OpenWith(ctx context.Context, rawURL string, opts *Options) (*Client, error) {
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
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := takeClientParams(u, &o); err != nil {
		return nil, err
	}
	shown := openurl.RedactURL(u)
	d, err := open(ctx, u)
	if err != nil {
		switch {
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return nil, redact(err, u)
		case errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnsupported):
			// The URL itself is wrong: report it as an invalid argument.
			var ie *InvalidArgumentError
			if errors.As(err, &ie) {
				return nil, redact(err, u)
			}
			return nil, redact(&InvalidArgumentError{Arg: "url", Reason: fmt.Sprintf("%s: %v", shown, err), cause: err}, u)
		}
		return nil, redact(&OpError{Op: "open", Name: "", Err: fmt.Errorf("%s: %w", shown, err)}, u)
	}
	c, err := newClient(d, &o)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return c, nil
}

// New returns a Client over d with the given defaults (nil: all defaults).
// The Client owns d and closes it in Close. New panics if opts are invalid,
// since they are a program's constants; use Open or validate with
// Options.Validate for options that come from users.
func New(d driver.Driver, opts *Options) *Client {
	c, err := newClient(d, opts)
	if err != nil {
		panic(err.Error())
	}
	return c
}

// Validate reports whether o (after defaults) is acceptable, naming the first
// bad field.
func (o *Options) Validate() error {
	r := o.withDefaults()
	return r.validate()
}

func newClient(d driver.Driver, opts *Options) (*Client, error) {
	if d == nil {
		return nil, invalid("driver", "must not be nil")
	}
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	c := &Client{
		d:         d,
		opts:      o,
		log:       o.Logger,
		hooks:     o.Hooks,
		backend:   backendOf(d),
		epoch:     time.Now(),
		heaps:     [nHeaps]leaseHeap{{k: byRenew}, {k: byEarly}, {k: byDeadline}},
		lostWatch: map[<-chan struct{}]*lostWatcher{},
		retries:   map[*releaseRetry]struct{}{},
		closing:   make(chan struct{}),
		ended:     make(chan struct{}),
		idle:      make(chan struct{}, 1),
	}
	c.renewer, c.reaper = newSleeper(c.closing), newSleeper(c.ended)
	c.closeCtx, c.stopCtx = context.WithCancel(context.Background())
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if l, ok := d.(driver.Limiter); ok {
		c.limits = l.Limits()
	}
	c.defaults, c.defaultsErr = c.resolve(nil)
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		c.runRenewer()
	}()
	go func() {
		defer c.wg.Done()
		c.runReaper()
	}()
	return c, nil
}

// Backend names the Client's backend, as Hooks, logs and metrics label it:
// the URL scheme of the dlock drivers without its TLS variant ("mem",
// "sqlite", "redis", "redlock", "etcd", "zk", "postgres", "mysql",
// "quorum"), and for another driver the name of its package, less a "lock"
// suffix.
func (c *Client) Backend() string { return c.backend }

// LockInfo describes one lock, as Inspect reports it. Kind tells a mutex
// (driver.Exclusive) from a read/write lock (driver.Write, whichever side is
// held; Readers counts its read holders) and a semaphore (driver.Permit;
// Permits is its size, Holders the permits taken). A name used as several
// lock types is listed once per type.
type LockInfo = driver.LockInfo

// Inspect lists the locks whose names start with prefix, for status output.
// It returns ErrUnsupported if the backend cannot list locks.
func (c *Client) Inspect(ctx context.Context, prefix string) ([]LockInfo, error) {
	in, ok := c.d.(driver.Inspector)
	if !ok {
		return nil, &OpError{Op: "inspect", Err: ErrUnsupported}
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	infos, err := in.Inspect(ctx, prefix)
	if err != nil {
		return nil, c.wrap("inspect", "", ctx, err)
	}
	return infos, nil
}

// Do takes the lock name (waiting as Lock does), runs fn, and releases the
// lock. fn's context is cancelled when ctx is, or when the lease is lost; fn
// should stop its work then. Do returns fn's error; if fn returned nil but the
// lease was lost while it ran, Do returns the lease's error (wrapping
// ErrLeaseLost), since the work may have overlapped another holder's.
func (c *Client) Do(ctx context.Context, name string, opts *MutexOptions, fn func(ctx context.Context, l *Lease) error) error {
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	l, err := c.NewMutex(name, opts).Lock(ctx)
	if err != nil {
		return err
	}
	workCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.Context(), func() { cancel(l.Err()) })
	ferr := fn(workCtx, l)
	stop()
	cancel(nil)
	lerr := l.Err()
	uerr := l.Unlock(context.WithoutCancel(ctx))
	switch {
	case ferr != nil:
		return ferr
	case lerr != nil:
		return lerr
	case uerr != nil && !errors.Is(uerr, ErrNotHeld):
		return uerr
	}
	return nil
}

// Close releases every lease the Client holds (best effort, in parallel,
// bounded by Options.ReleaseTimeout), ends them with ErrClosed, stops every
// goroutine the Client started and closes the driver. Releases that an
// earlier Unlock left unconfirmed, and that were still being retried in the
// background, get one last attempt within the same bound; a session-bound
// backend's driver then ends the session, which frees whatever it still
// holds. Lock calls waiting at the time return ErrClosed; an acquire whose
// attempt is in flight when Close begins is waited for (within the same
// bound), and whatever it was granted is released before it returns
// ErrClosed. Close is idempotent; later calls return the first call's result.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		c.closed.Store(true)
		leases := append([]*Lease(nil), c.heaps[byDeadline].ls...)
		c.mu.Unlock()
		close(c.closing)
		c.stopCtx()
		// The background releases stop at once (closeCtx cancels any
		// attempt in flight); those not confirmed get a last attempt below.
		c.retryWG.Wait()
		c.mu.Lock()
		retries := make([]*releaseRetry, 0, len(c.retries))
		for p := range c.retries {
			retries = append(retries, p)
		}
		clear(c.retries)
		c.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), c.opts.ReleaseTimeout)
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for _, l := range leases {
			if !l.beginRelease() {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func(l *Lease) {
				defer wg.Done()
				defer func() { <-sem }()
				if _, err := c.d.Release(ctx, l.driverLease()); err != nil && !errors.Is(err, ErrNotHeld) {
					c.log.Warn("dlock: release on close failed; the lock will expire by TTL", "backend", c.backend, "name", l.name, "err", err)
				}
				l.end(ErrClosed)
			}(l)
		}
		for _, p := range retries {
			wg.Add(1)
			sem <- struct{}{}
			go func(p *releaseRetry) {
				defer wg.Done()
				defer func() { <-sem }()
				if _, err := c.d.Release(ctx, p.dl); err != nil && !errors.Is(err, ErrNotHeld) {
					c.log.Warn("dlock: last attempt of a background release on close failed; the lock will expire by TTL or with the session",
						"backend", c.backend, "op", p.op, "name", p.dl.Name, "err", err)
				}
			}(p)
		}
		wg.Wait()
		// An acquire whose attempt was in flight releases its grant, if
		// any, through the driver: wait for it (within the same bound).
		if c.acquiring.Load() > 0 {
			select {
			case <-c.idle:
			case <-ctx.Done():
			}
		}
		cancel()
		close(c.ended)
		c.wg.Wait()
		c.closeErr = c.d.Close()
	})
	return c.closeErr
}

func (c *Client) isClosed() bool { return c.closed.Load() }

// acquireStarted counts an acquire under way; false (and not counted) if the
// Client has closed.
func (c *Client) acquireStarted() bool {
	c.acquiring.Add(1)
	if c.isClosed() {
		c.acquireDone()
		return false
	}
	return true
}

// acquireDone ends what acquireStarted counted.
func (c *Client) acquireDone() {
	if c.acquiring.Add(-1) == 0 && c.isClosed() {
		select {
		case c.idle <- struct{}{}:
		default:
		}
	}
}

// lostWatcher ends the leases bound to one driver loss channel: its map
// holds each lease's Grant.Cause.
type lostWatcher struct {
	leases map[*Lease]func() error
	stop   chan struct{} // closed when no lease needs watching any more
}

// register adds a lease to the client's books, watching lost with cause for
// it; false if the client closed.
func (c *Client) register(l *Lease, lost <-chan struct{}, cause func() error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return false
	}
	l.registered = true
	c.scheduleDeadlineLocked(l)
	if l.flags&autoRenew != 0 {
		c.scheduleRenewLocked(l, l.keys[byRenew])
	}
	if lost != nil {
		w, ok := c.lostWatch[lost]
		if lost == c.idleLost {
			c.idleLost = nil
		}
		if !ok {
			w = &lostWatcher{leases: map[*Lease]func() error{}, stop: make(chan struct{})}
			c.lostWatch[lost] = w
			c.wg.Add(1)
			go c.watchLost(lost, w)
		}
		w.leases[l] = cause
		l.flags |= watched // l is not shared yet
	}
	return true
}

// unregister takes l out of the client's books (l.mu held).
func (c *Client) unregister(l *Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !l.registered {
		return
	}
	l.registered = false
	c.unscheduleRenewLocked(l)
	c.heaps[byDeadline].remove(l)
	if l.flags&watched == 0 {
		return
	}
	// A lease does not keep its loss channel: its watcher is found among
	// the Client's, of which there is usually one per session.
	for lost, w := range c.lostWatch {
		if _, ok := w.leases[l]; ok {
			delete(w.leases, l)
			if len(w.leases) == 0 && lost != c.idleLost {
				// Kept for the next grant on lost; the watcher idle
				// before, if any, stops.
				if old := c.idleLost; old != nil {
					close(c.lostWatch[old].stop)
					delete(c.lostWatch, old)
				}
				c.idleLost = lost
			}
			return
		}
	}
}

// lostOf returns the driver loss channel l is bound to (nil if none, or if
// l has ended).
func (c *Client) lostOf(l *Lease) <-chan struct{} {
	if l.flags&watched == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for lost, w := range c.lostWatch {
		if _, ok := w.leases[l]; ok {
			return lost
		}
	}
	return nil
}

// watchLost ends every lease bound to a driver loss channel when it closes.
func (c *Client) watchLost(lost <-chan struct{}, w *lostWatcher) {
	defer c.wg.Done()
	select {
	case <-lost:
	case <-w.stop:
		return
	case <-c.closing:
		return
	}
	type bound struct {
		l     *Lease
		cause func() error
	}
	c.mu.Lock()
	// The watcher ends here: a grant bound to lost from now on gets a new
	// one, which sees lost closed at once.
	if c.lostWatch[lost] == w {
		delete(c.lostWatch, lost)
	}
	if c.idleLost == lost {
		c.idleLost = nil
	}
	ls := make([]bound, 0, len(w.leases))
	for l, cause := range w.leases {
		ls = append(ls, bound{l, cause})
	}
	c.mu.Unlock()
	for _, b := range ls {
		cause := error(driver.ErrSessionLost)
		if b.cause != nil {
			if err := b.cause(); err != nil {
				cause = err
			}
		}
		b.l.lose(cause)
	}
}

// wrap turns a driver error into the error a user sees: sentinels and
// context errors pass through (wrapped once with the name); the rest become
// an *OpError.
func (c *Client) wrap(op, name string, ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("dlock: %s %q: %w", op, name, ctx.Err())
	}
	var oe *OpError
	var ie *InvalidArgumentError
	if errors.As(err, &oe) || errors.As(err, &ie) {
		return err
	}
	return &OpError{Op: op, Name: name, Err: err}
}
