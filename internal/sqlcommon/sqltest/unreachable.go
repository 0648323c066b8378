package sqltest

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// Unreachable checks that a driver opened from rawURL, which names a port
// nobody listens on, reports that the server cannot be reached, not a
// failure of the first statement it would send (wrongMsg, e.g. "creating
// lock table").
func Unreachable(t *testing.T, rawURL, wrongMsg string, open func(context.Context, *url.URL) (driver.Driver, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	d, err := open(ctx, u)
	if err == nil {
		defer d.Close()
		_, err = d.TryAcquire(ctx, driver.AcquireRequest{Name: "x", Owner: "o", TTL: time.Second})
	}
	if err == nil {
		t.Fatal("acquire on an unreachable server succeeded")
	}
	if msg := err.Error(); strings.Contains(msg, wrongMsg) || !strings.Contains(msg, "cannot reach the server") {
		t.Fatalf("error %q: want it to say the server cannot be reached, not %q", msg, wrongMsg)
	}
}
