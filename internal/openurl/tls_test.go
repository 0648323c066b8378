package openurl

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock/dlock/driver"
)

func TestTakeTLSOn(t *testing.T) {
	for _, c := range []struct {
		query string
		on    bool
		err   string
	}{
		{"", false, ""},
		{"tls=true", true, ""},
		{"tls=0", false, ""},
		{"ca_file=/ca.pem", true, ""},
		{"server_name=x", true, ""},
		{"cert_file=/c.pem&key_file=/k.pem", true, ""},
		{"cert_file=/c.pem", false, "cert_file and key_file must be given together"},
		{"ca_file=", false, "ca_file is empty"},
		{"tls=false&ca_file=/ca.pem", false, "tls=false contradicts"},
		{"tls=maybe", false, "want true or false"},
	} {
		q, _ := url.ParseQuery(c.query + "&other=1")
		p, on, err := TakeTLSOn(q)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, driver.ErrInvalid) {
				t.Errorf("%q: err %v, want one wrapping ErrInvalid containing %q", c.query, err, c.err)
			}
			continue
		}
		if err != nil || on != c.on || q.Get("other") != "1" || q.Has("tls") || q.Has("ca_file") {
			t.Errorf("%q: %+v on=%v err=%v rest=%v", c.query, p, on, err, q)
		}
	}
}

func TestTLSFileParamsAreNotSecret(t *testing.T) {
	for _, n := range TLSParamNames {
		if SecretParam(n) {
			t.Errorf("%s is treated as a secret; it names a file or a host", n)
		}
	}
	u, _ := url.Parse("rediss://:pw@h/0?ca_file=/ca.pem&cert_file=/c.pem&key_file=/k.pem&server_name=s")
	if got := RedactURL(u); !strings.Contains(got, "key_file=/k.pem") || strings.Contains(got, "pw") {
		t.Errorf("RedactURL = %s", got)
	}
}

func TestApplyMissingFile(t *testing.T) {
	err := TLSParams{CAFile: "/nonexistent/ca.pem"}.Apply(nil)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Errorf("err %v, want the path named", err)
	}
}
