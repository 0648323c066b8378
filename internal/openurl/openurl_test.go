package openurl

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock/dlock/driver"
)

func TestSecretParam(t *testing.T) {
	for name, want := range map[string]bool{
		"password": true, "PASSWORD": true, "sslpassword": true, "passwd": true,
		"pass": true, "user_pass": true, "pwd": true, "secret": true,
		"client_secret": true, "token": true, "auth_token": true,
		"access-token": true, "auth": true, "credentials": true,
		"api_key": true, "API-Key": true, "auth_key": true, "secret.key": true,
		"key_file": false, "sslkey": false, "key_prefix": false, "cert_file": false,
		"allowCleartextPasswords": false, "db": false, "ttl": false,
		"sslmode": false, "user": false, "": false,
	} {
		if got := SecretParam(name); got != want {
			t.Errorf("SecretParam(%q) = %v, want %v", name, got, want)
		}
	}
}

// A one- or two-character password is still a password: every secret is
// masked whatever its length.
func TestShortSecretsMasked(t *testing.T) {
	for raw, secret := range map[string]string{
		"redis://u:ab@host:1/0":        ":ab@",
		"redis://host:1/0?password=ab": "=ab",
		"redis://u:Z@host:1/0":         ":Z@",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if e := RedactError(fmt.Errorf("dial %s: refused", raw), u); strings.Contains(e.Error(), secret) {
			t.Errorf("RedactError(%q) = %q: the short secret %q shows", raw, e, secret)
		}
		if s := RedactURL(u); strings.Contains(s, secret) {
			t.Errorf("RedactURL(%q) = %q: the short secret %q shows", raw, s, secret)
		}
	}
}

func TestSecretsEveryForm(t *testing.T) {
	raw := "pg://u:p%40ss%2Fw%3Ard%20x@h/db?sslpassword=q%2dw+e%26r&key_file=/k.pem&db=3"
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	// The raw text, the decoded values and their re-escaped forms.
	text := raw + " " + u.String() + " p@ss/w:rd x " + " q-w e&r q-w+e%26r q-w%20e&r"
	got := Scrub(text, Secrets(u))
	for _, leak := range []string{"p@ss", "p%40ss", "w:rd", "w%3Ard", "q-w", "q%2dw", "e&r", "e%26r"} {
		if strings.Contains(got, leak) {
			t.Errorf("Scrub left %q in %q", leak, got)
		}
	}
	for _, keep := range []string{"key_file=/k.pem", "db=3", "pg://u:"} {
		if !strings.Contains(got, keep) {
			t.Errorf("Scrub removed %q, which is not secret: %q", keep, got)
		}
	}
}

func TestRedactURLKeepsTheRest(t *testing.T) {
	u, _ := url.Parse("redis://alice:pw@h:1/0?key_prefix=app%3A&password=pw2&db=3")
	want := "redis://alice:xxxxx@h:1/0?key_prefix=app%3A&password=xxxxx&db=3"
	if got := RedactURL(u); got != want {
		t.Errorf("RedactURL = %q, want %q", got, want)
	}
	if RedactURL(nil) != "" {
		t.Error("RedactURL(nil) not empty")
	}
}

func TestRedactErrorKeepsChain(t *testing.T) {
	u, _ := url.Parse("redis://u:hunter2@h/0")
	inner := errors.New("boom")
	err := RedactError(fmt.Errorf("dial redis://u:hunter2@h/0: %w", inner), u)
	if strings.Contains(err.Error(), "hunter2") || !errors.Is(err, inner) {
		t.Fatalf("RedactError = %v: leaks, or lost the chain", err)
	}
	plain := errors.New("nothing secret")
	if RedactError(plain, u) != plain {
		t.Error("an error without secrets was rewrapped")
	}
	if RedactError(nil, u) != nil || RedactError(plain, nil) != plain {
		t.Error("nil handling")
	}
}

func TestBadURL(t *testing.T) {
	cause := errors.New("parse failure")
	err := BadURL("memlock: unknown URL parameter %q: %w", "bogus", cause)
	if !errors.Is(err, driver.ErrInvalid) || !errors.Is(err, cause) {
		t.Fatalf("BadURL = %v: does not wrap driver.ErrInvalid and its cause", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Arg != "url" {
		t.Fatalf("BadURL = %#v, want an *Error for url", err)
	}
	if got, want := err.Error(), `memlock: unknown URL parameter "bogus": parse failure`; got != want {
		t.Fatalf("BadURL text = %q, want %q", got, want)
	}
	if err := Invalid("TTL", "too short"); !errors.Is(err, driver.ErrInvalid) || err.(*Error).Arg != "TTL" {
		t.Fatalf("Invalid = %v", err)
	}
}

// A URL that url.Parse refuses may still be echoed by a library: its
// password and secret parameters are found in the raw text.
func TestSecretsOfUnparsable(t *testing.T) {
	raw := "redis://alice:hunter%2d2@127.0.0.1:1/%zz?token=tk1&db=3" // %zz: url.Parse refuses it
	got := Scrub("dial "+raw+" (hunter-2)", SecretsOf(raw))
	for _, leak := range []string{"hunter", "tk1"} {
		if strings.Contains(got, leak) {
			t.Errorf("Scrub(SecretsOf) left %q in %q", leak, got)
		}
	}
	if !strings.Contains(got, "alice") || !strings.Contains(got, "db=3") {
		t.Errorf("Scrub(SecretsOf) hid more than the secrets: %q", got)
	}
	if len(SecretsOf("no secrets here")) != 0 || len(SecretsOf("redis://h/0")) != 0 {
		t.Error("SecretsOf found secrets in URLs without any")
	}
}
