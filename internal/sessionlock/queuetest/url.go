package queuetest

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// URLCase is one case for ParseURL: a URL and either the text its error
// must contain or a check of what it parses into.
type URLCase[P any] struct {
	URL, Err string
	Check    func(P) bool
}

// ParseURL parses each case's URL with parse. An error must contain Err
// and never the password "s3cret", and wrap driver.ErrInvalid (bad input,
// not an unreachable backend); a success must pass Check.
func ParseURL[P any](t *testing.T, parse func(*url.URL) (P, error), cases []URLCase[P]) {
	t.Helper()
	for _, tc := range cases {
		u, err := url.Parse(tc.URL)
		if err != nil {
			t.Fatal(err)
		}
		p, err := parse(u)
		if tc.Err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.Err) {
				t.Errorf("%s: err %v, want %q", tc.URL, err, tc.Err)
			}
			if err != nil && !errors.Is(err, driver.ErrInvalid) {
				t.Errorf("%s: err %v does not wrap driver.ErrInvalid: bad input must be told from an unreachable backend", tc.URL, err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: error shows the password: %v", tc.URL, err)
			}
			continue
		}
		if err != nil || !tc.Check(p) {
			t.Errorf("%s: %+v %v", tc.URL, p, err)
		}
	}
}

// OpenURL opens a driver from rawURL with open, takes and releases the lock
// "x" through it (running between, when not nil, while it is held), and
// checks that opening badURL (a closed port with a short connect timeout)
// fails.
func OpenURL(t *testing.T, open func(context.Context, *url.URL) (driver.Driver, error), rawURL, badURL string, between func()) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	d, err := open(Ctx(t, 20*time.Second), u)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g, err := d.TryAcquire(Ctx(t, 5*time.Second), Req("x", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if between != nil {
		between()
	}
	if _, err := d.Release(Ctx(t, 5*time.Second), Lease("x", "A", g)); err != nil {
		t.Fatal(err)
	}
	bad, err := url.Parse(badURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(Ctx(t, 5*time.Second), bad); err == nil {
		t.Fatal("OpenURL to a closed port succeeded")
	}
}
