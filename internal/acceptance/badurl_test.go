package acceptance

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dlock/dlock"
)

// A URL a driver refuses before connecting is bad input (ErrInvalid), told
// apart from an unreachable backend, and never shows its password.
func TestDriversReportBadURLsAsInvalid(t *testing.T) {
	dir := t.TempDir()
	for _, u := range []string{
		"redis://u:s3cr3tpw@127.0.0.1:1/0?key_prefix=",
		"redis://u:s3cr3tpw@127.0.0.1:1/notadb",
		"redlock://u:s3cr3tpw@?",
		"redlock://u:s3cr3tpw@127.0.0.1:1,127.0.0.1:2?node_timeout=soon",
		"postgres://u:s3cr3tpw@127.0.0.1:1/db?mode=bogus",
		"mysql://u:s3cr3tpw@127.0.0.1:1/db?mode=bogus",
		"sqlite://" + dir + "/x.db?bogus=1",
		"etcd://u:s3cr3tpw@127.0.0.1:1?session_ttl=forever",
		"etcd://u:s3cr3tpw@?",
		"zk://u:s3cr3tpw@127.0.0.1:1/root?acl=bogus",
		"zk://u:s3cr3tpw@127.0.0.1:1/root?session_timeout=-1s",
	} {
		c, err := dlock.Open(context.Background(), u)
		if err == nil {
			_ = c.Close()
			t.Fatalf("Open(%q) succeeded", u)
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", u, err)
		}
		if strings.Contains(err.Error(), "s3cr3tpw") {
			t.Errorf("Open(%q) leaks the password: %v", u, err)
		}
	}
}
