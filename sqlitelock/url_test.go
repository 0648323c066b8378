package sqlitelock

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

func TestURLPath(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"sqlite:///var/lib/x.db", "/var/lib/x.db"},
		{"sqlite:////tmp/x.db", "//tmp/x.db"}, // cleaned by filepath.Abs to /tmp/x.db
		{"sqlite://locks/app.db", "locks/app.db"},
		{"sqlite://x.db", "x.db"},
		{"sqlite:rel/x.db", "rel/x.db"},
		{"sqlite:///tmp/a%20b%23c.db", "/tmp/a b#c.db"},
		{"sqlite:///tmp/x.db?table=t", "/tmp/x.db"},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		got, err := urlPath(u)
		if err != nil || got != tc.want {
			t.Errorf("urlPath(%s) = %q, %v; want %q", tc.url, got, err, tc.want)
		}
	}
}

func TestURLErrors(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"sqlite://", "no file path"},
		{"sqlite:///", "no file path"},
		{"sqlite://user:hunter2@host/x.db", "no user name or password"},
		{"sqlite://localhost:5432/x.db", "has a port"},
		{"sqlite:///x.db#frag", "fragment"},
		{"sqlite:///x.db?tabel=x&zzz=1", `unknown URL parameter(s) "tabel", "zzz"`},
		{"sqlite:///x.db?table=a&table=b", `"table" given 2 times`},
		{"sqlite:///x.db?table=", `"table" is empty`},
		{"sqlite:///x.db?table=a-b", "invalid table name"},
		{"sqlite:///x.db?busy_timeout=5", "not a duration"},
		{"sqlite:///x.db?busy_timeout=-1s", "negative"},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		d, err := OpenURL(context.Background(), u)
		if err == nil {
			d.Close()
			t.Errorf("OpenURL(%s) succeeded", tc.url)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenURL(%s) = %q, want it to mention %q", tc.url, err, tc.want)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("OpenURL(%s) echoes the password: %q", tc.url, err)
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("OpenURL(%s) = %q, does not wrap dlock.ErrInvalid", tc.url, err)
		}
		// Through dlock.Open: an invalid URL, never the password.
		_, err = dlock.Open(context.Background(), tc.url)
		var ie *dlock.InvalidArgumentError
		if !errors.As(err, &ie) || ie.Arg != "url" || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("dlock.Open(%s) = %v, want an invalid url error without the password", tc.url, err)
		}
	}
}

func TestURLOptions(t *testing.T) {
	o, err := urlOptions(url.Values{"table": {"my_locks"}, "busy_timeout": {"250ms"}})
	if err != nil {
		t.Fatal(err)
	}
	if o.Table != "my_locks" || o.BusyTimeout != 250*time.Millisecond {
		t.Fatalf("options = %+v", o)
	}
}

func TestDlockOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "x.db")
	ctx := context.Background()
	c, err := dlock.Open(ctx, "sqlite://"+path+"?table=t1&busy_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.NewMutex("job", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != 1 {
		t.Errorf("token %d, want 1", l.Token())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file not created: %v", err)
	}

	// A relative path is relative to the working directory.
	t.Chdir(dir)
	c2, err := dlock.Open(ctx, "sqlite://rel/y.db")
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	if _, err := os.Stat(filepath.Join(dir, "rel", "y.db")); err != nil {
		t.Fatalf("relative database file not created: %v", err)
	}
}
