package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
)

// errEcho is what the echo opener's errors wrap.
var errEcho = errors.New("echo: refused")

// The echo:// scheme exists only in this test binary. Its opener does what
// careless client libraries do: it puts the whole URL, password and secret
// query parameters included, into its error. Open's redaction is then all
// that stands between the secret and the caller. The host picks the kind of
// error: "invalid" an *InvalidArgumentError, "badurl" what drivers return
// for a URL they refuse (openurl.BadURL), "wrapped-invalid" a plain error
// wrapping ErrInvalid, "cancelled" a context error, anything else an
// unreachable backend.
func init() {
	dlock.Register("echo", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		switch u.Hostname() {
		case "invalid":
			return nil, &dlock.InvalidArgumentError{Arg: "url", Reason: "echo: cannot use " + u.String()}
		case "badurl":
			return nil, openurl.BadURL("echo: cannot use %s", u.String())
		case "wrapped-invalid":
			return nil, fmt.Errorf("echo: %s: %w: %w", u.String(), dlock.ErrInvalid, errEcho)
		case "cancelled":
			return nil, fmt.Errorf("echo: dial %s: %w", u.String(), context.Canceled)
		}
		return nil, fmt.Errorf("echo: dial %s: connection refused: %w", u.String(), errEcho)
	})
}

func checkNoSecret(t *testing.T, rawURL string, err error, secrets ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Open(%q) succeeded", rawURL)
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Fatalf("Open(%q) error leaks %q: %v", rawURL, s, err)
		}
	}
}

func TestOpenNeverEchoesPassword(t *testing.T) {
	for _, u := range []string{
		"mem://user:s3cr3tpw@host/x?bogus=1",
		"nosuch://user:s3cr3tpw@host/x",
		"mem://user:s3cr3tpw@host/x?ttl=abc",
		"mem://user:s3cr3tpw@host:bad port/x",
		"echo://user:s3cr3tpw@down/x",
		"echo://user:s3cr3tpw@invalid/x",
		"echo://user:s3cr3tpw@wrapped-invalid/x",
		"echo://user:s3cr3tpw@badurl/x",
	} {
		_, err := dlock.Open(context.Background(), u)
		checkNoSecret(t, u, err, "s3cr3tpw")
	}
	// The errors keep their meaning under the redaction.
	u := "echo://user:s3cr3tpw@down:6379/x"
	_, err := dlock.Open(context.Background(), u)
	var oe *dlock.OpError
	if !errors.As(err, &oe) || !errors.Is(err, errEcho) || !strings.Contains(err.Error(), "xxxxx") {
		t.Fatalf("Open(%q) = %v, want a redacted *OpError wrapping the opener's error", u, err)
	}
	u = "echo://user:s3cr3tpw@invalid/x"
	if _, err := dlock.Open(context.Background(), u); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "xxxxx") {
		t.Fatalf("Open(%q) = %v, want a redacted invalid-argument error", u, err)
	}
	u = "echo://user:s3cr3tpw@wrapped-invalid/x"
	if _, err := dlock.Open(context.Background(), u); !errors.Is(err, dlock.ErrInvalid) || !errors.Is(err, errEcho) {
		t.Fatalf("Open(%q) = %v, want ErrInvalid wrapping the opener's error", u, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	u = "echo://user:s3cr3tpw@cancelled/x"
	_, err = dlock.Open(ctx, u)
	checkNoSecret(t, u, err, "s3cr3tpw")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Open(%q) with a cancelled context = %v, want context.Canceled", u, err)
	}
}

// A password with characters that URLs escape appears escaped in the URL's
// text, which is what a client library echoes: that form must be hidden too.
func TestOpenHidesEscapedPassword(t *testing.T) {
	for _, u := range []string{
		"echo://user:p%40ss%2Fw%3Ard%20x@down/x",
		"echo://user:p%40ss%2Fw%3Ard%20x@invalid/x",
		"echo://down/x?password=p%40ss%2Fw%3Ard%20x",
		"echo://down/x?sslpassword=p%40ss+w%26rd",
	} {
		_, err := dlock.Open(context.Background(), u)
		checkNoSecret(t, u, err, "p@ss", "p%40ss", "w%3Ard", "w:rd", "w%26rd", "w&rd")
	}
}

func TestOpenHidesSecretQueryParams(t *testing.T) {
	for _, u := range []string{
		"mem://x?password=hunter22&bogus=1",
		"echo://down/x?password=hunter22&ttl=1s",
		"echo://invalid/x?sslpassword=hunter22",
		"echo://down/x?token=hunter22",
		"echo://down/x?auth_key=hunter22&db=3",
	} {
		_, err := dlock.Open(context.Background(), u)
		checkNoSecret(t, u, err, "hunter22")
	}
	_, err := dlock.Open(context.Background(), "mem://x?password=hunter22&bogus=1")
	if !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("a URL the driver refuses = %v, want ErrInvalid", err)
	}
	_, err = dlock.Open(context.Background(), "echo://down/x?password=hunter22&db=3")
	if !errors.Is(err, errEcho) || !strings.Contains(err.Error(), "db=3") {
		t.Fatalf("Open = %v: want the opener's error, with only the secret hidden", err)
	}
}

// A short password is still a password: it is hidden whatever its length
// (a "3 characters or more" rule leaked "zq").
func TestOpenHidesShortSecrets(t *testing.T) {
	for u, secret := range map[string]string{
		"echo://user:zq@down/x":     ":zq@",
		"echo://user:zq@invalid/x":  ":zq@",
		"echo://down/x?password=zq": "=zq",
		"echo://down/x?token=q":     "token=q",
	} {
		_, err := dlock.Open(context.Background(), u)
		checkNoSecret(t, u, err, secret)
	}
}

// Parameters that only look like secrets are shown: key_prefix is a
// namespace and key_file a path, which the user needs to see to fix a
// mistake. The password next to them is still hidden.
func TestOpenShowsNonSecretKeyParams(t *testing.T) {
	u := "echo://user:s3cr3tpw@down/x?key_prefix=app1&key_file=/etc/k.pem"
	_, err := dlock.Open(context.Background(), u)
	checkNoSecret(t, u, err, "s3cr3tpw")
	for _, want := range []string{"key_prefix=app1", "k.pem"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v: %q is not a secret and should show", u, err, want)
		}
	}
}

// A driver refuses a URL with openurl.BadURL, an error wrapping
// driver.ErrInvalid: Open reports it as an *InvalidArgumentError for "url"
// (dlock.ErrInvalid is driver.ErrInvalid), with the URL redacted.
func TestOpenClassifiesDriverInvalid(t *testing.T) {
	if dlock.ErrInvalid != driver.ErrInvalid {
		t.Fatal("dlock.ErrInvalid is not driver.ErrInvalid")
	}
	u := "echo://user:s3cr3tpw@badurl/x?password=pw2&db=3"
	_, err := dlock.Open(context.Background(), u)
	checkNoSecret(t, u, err, "s3cr3tpw", "pw2")
	var ie *dlock.InvalidArgumentError
	if !errors.As(err, &ie) || ie.Arg != "url" || !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Open(%q) = %#v, want an *InvalidArgumentError for url wrapping driver.ErrInvalid", u, err)
	}
	if want := "dlock: invalid url: echo://user:xxxxx@badurl/x?"; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "echo: cannot use") {
		t.Fatalf("Open(%q) = %q, want it to start %q and keep the driver's reason", u, err, want)
	}
}
