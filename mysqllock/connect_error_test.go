package mysqllock

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// TestUnreachableServerSaysSo: a server that cannot be reached is reported
// as such, not as a failure to create the lock table (the first statement
// a driver sends).
func TestUnreachableServerSaysSo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, _ := url.Parse("mysql://dlock:pw@127.0.0.1:1/dlock")
	d, err := OpenURL(ctx, u)
	if err == nil {
		defer d.Close()
		_, err = d.TryAcquire(ctx, driver.AcquireRequest{Name: "x", Owner: "o", TTL: time.Second})
	}
	if err == nil {
		t.Fatal("acquire on an unreachable server succeeded")
	}
	if msg := err.Error(); strings.Contains(msg, "creating lock table") || !strings.Contains(msg, "cannot reach the server") {
		t.Fatalf("error %q: want it to say the server cannot be reached, not blame the lock table", msg)
	}
}
