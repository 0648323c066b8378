// Package tlstest runs the TLS and authentication cases that every
// TLS-capable backend's tests share: each case opens a URL with dlock.Open
// against a real server and either takes and releases a lock, or expects an
// error with a given reason and without the case's secret.
package tlstest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// Case is one URL to open.
type Case struct {
	Name string
	URL  string
	// WantErr is empty when Open must succeed (the case then takes and
	// releases a lock); else every one of its "|"-separated alternatives is
	// tried and one must be in Open's error text.
	WantErr string
	// Secret, when set, must not appear in the error text.
	Secret string
}

// Run runs each case as a subtest, with a generous deadline per case.
func Run(t *testing.T, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cl, err := dlock.Open(ctx, c.URL)
			if c.WantErr == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				defer cl.Close()
				lease, err := cl.NewMutex("tlstest/"+c.Name, nil).TryLock(ctx)
				if err != nil {
					t.Fatalf("TryLock: %v", err)
				}
				if err := lease.Unlock(ctx); err != nil {
					t.Fatalf("Unlock: %v", err)
				}
				return
			}
			if err == nil {
				cl.Close()
				t.Fatalf("Open succeeded, want an error containing %q", c.WantErr)
			}
			msg := err.Error()
			if c.Secret != "" && strings.Contains(msg, c.Secret) {
				t.Errorf("the error holds the secret %q: %s", c.Secret, msg)
			}
			for _, alt := range strings.Split(c.WantErr, "|") {
				if strings.Contains(msg, alt) {
					t.Logf("error as wanted: %s", msg)
					return
				}
			}
			t.Errorf("error %q, want one containing %q", msg, c.WantErr)
		})
	}
}
