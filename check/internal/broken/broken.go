// Package broken is a deliberately broken dlock driver, for showing that the
// checker catches what a broken lock does. Its locks live in one JSON file
// guarded by flock(2), so worker processes on one machine share them. Each
// mode breaks one promise:
//
//	grant-twice   TryAcquire grants a held lock anyway, one time in three
//	reuse-tokens  every grant of a name gets the same fencing token
//	release-any   Release and Renew succeed whoever holds the lock, so a
//	              stale holder's Unlock frees (and its renewal extends) a
//	              newer holder's grant. So that this shows without a lucky
//	              pause, one refused TryAcquire in four reports a failed
//	              round trip instead: the dlock client then cleans up with
//	              a Release under the attempt's own fresh owner, which this
//	              mode lets free the holder's lock
//
// The URL is checkbroken:///abs/path/store.json?mode=MODE. Never use it for
// anything but testing the checker.
package broken

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// Scheme is the URL scheme Register adds.
const Scheme = "checkbroken"

// The modes, as the URL's mode parameter names them.
const (
	GrantTwice  = "grant-twice"
	ReuseTokens = "reuse-tokens"
	ReleaseAny  = "release-any"
)

var once sync.Once

// errLostReply is what release-any reports for some refused attempts.
var errLostReply = errors.New("checkbroken: reply lost")

// Register adds the checkbroken scheme to dlock.Open. It is idempotent.
func Register() {
	once.Do(func() { dlock.Register(Scheme, OpenURL) })
}

// OpenURL opens the driver from a checkbroken URL.
func OpenURL(_ context.Context, u *url.URL) (driver.Driver, error) {
	mode := u.Query().Get("mode")
	switch mode {
	case GrantTwice, ReuseTokens, ReleaseAny:
	default:
		return nil, openurl.BadURL("checkbroken: mode must be %s, %s or %s, got %q", GrantTwice, ReuseTokens, ReleaseAny, mode)
	}
	if u.Path == "" {
		return nil, openurl.BadURL("checkbroken: the URL needs a store path (checkbroken:///abs/path?mode=…)")
	}
	return &Driver{path: u.Path, mode: mode}, nil
}

// Driver is the broken driver.
type Driver struct {
	path string
	mode string
}

type entry struct {
	Owner string `json:"owner"`
	Token uint64 `json:"token"`
	Count int    `json:"count"`
	Until int64  `json:"until"` // wall clock, Unix ns; 0 when free
}

type store struct {
	Locks map[string]*entry `json:"locks"`
	Fence map[string]uint64 `json:"fence"`
}

// update runs fn on the store under an exclusive flock.
func (d *Driver) update(fn func(s *store) error) error {
	f, err := os.OpenFile(d.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing unlocks too
	st := &store{Locks: map[string]*entry{}, Fence: map[string]uint64{}}
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		if err := json.NewDecoder(f).Decode(st); err != nil {
			return fmt.Errorf("checkbroken: corrupt store: %w", err)
		}
		if st.Locks == nil {
			st.Locks = map[string]*entry{}
		}
		if st.Fence == nil {
			st.Fence = map[string]uint64{}
		}
	}
	if err := fn(st); err != nil {
		return err
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.WriteAt(b, 0)
	return err
}

// TryAcquire grants, re-enters or refuses; see the package doc for how each
// mode gets it wrong.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	var g driver.Grant
	err := d.update(func(s *store) error {
		now := time.Now().UnixNano()
		e := s.Locks[req.Name]
		live := e != nil && e.Until > now
		switch {
		case live && e.Owner == req.Owner:
			e.Count++
			e.Until = now + int64(req.TTL)
			g = driver.Grant{Token: e.Token, Count: e.Count}
			return nil
		case live && d.mode == ReleaseAny && rand.IntN(4) == 0:
			return errLostReply
		case live && !(d.mode == GrantTwice && rand.IntN(3) == 0):
			return &driver.LockedError{RetryAfter: time.Duration(e.Until - now), Token: e.Token}
		}
		token := s.Fence[req.Name] + 1
		if d.mode == ReuseTokens && s.Fence[req.Name] > 0 {
			token = s.Fence[req.Name]
		}
		s.Fence[req.Name] = token
		s.Locks[req.Name] = &entry{Owner: req.Owner, Token: token, Count: 1, Until: now + int64(req.TTL)}
		g = driver.Grant{Token: token, Count: 1}
		return nil
	})
	return g, err
}

// Release gives up one hold; in release-any mode whoever holds the lock.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	remaining := 0
	err := d.update(func(s *store) error {
		e := s.Locks[l.Name]
		now := time.Now().UnixNano()
		if d.mode == ReleaseAny {
			delete(s.Locks, l.Name)
			return nil
		}
		if e == nil || e.Owner != l.Owner || e.Until <= now {
			return driver.ErrNotHeld
		}
		e.Count--
		if remaining = e.Count; remaining == 0 {
			delete(s.Locks, l.Name)
		}
		return nil
	})
	return remaining, err
}

// Renew extends every lease; in release-any mode it reports success for
// leases it no longer has.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	errs := make([]error, len(ls))
	err := d.update(func(s *store) error {
		now := time.Now().UnixNano()
		for i, l := range ls {
			e := s.Locks[l.Name]
			if e == nil || e.Owner != l.Owner || e.Until <= now {
				if d.mode != ReleaseAny {
					errs[i] = driver.ErrNotHeld
				}
				continue
			}
			e.Until = now + int64(l.TTL)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// Close does nothing: the driver holds no resources between calls.
func (d *Driver) Close() error { return nil }
