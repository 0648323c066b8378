package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/memlock"
	"github.com/redis/go-redis/v9"
)

// authSecret is the password of the test-auth:// backend; tests look for it
// in everything dlock prints or passes on.
const authSecret = "s3cret-Pa55"

func init() {
	// A backend that wants a password, as production servers do:
	// test-auth://:s3cret-Pa55@NAME opens the memlock backend NAME.
	dlock.Register("test-auth", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		if pw, _ := u.User.Password(); pw != authSecret {
			return nil, fmt.Errorf("authentication failed for %s", u.String())
		}
		return memlock.Named("auth" + u.Host).NewDriver(), nil
	})
}

// authURL returns a fresh test-auth URL with the right password and the
// backend behind it.
func authURL() (string, *memlock.Backend) {
	name := fmt.Sprintf("clitest%d", memSeq.Add(1))
	return "test-auth://:" + authSecret + "@" + name, memlock.Named("auth" + name)
}

// writeURLFile writes content to a new file of the given mode and returns
// its path.
func writeURLFile(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dlock url")
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // umask may have cut it
		t.Fatal(err)
	}
	return path
}

// TestURLFile: the URL is read from --url-file or $DLOCK_URL_FILE, with the
// trailing newline (and blanks) dropped, and takes the place of --url or
// $DLOCK_URL.
func TestURLFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		flag    bool              // --url-file FILE, else $DLOCK_URL_FILE
		vars    map[string]string // more variables
	}{
		{"flag", "%s\n", true, nil},
		{"variable", "%s\n", false, nil},
		{"CRLF and blanks", "  %s \r\n", true, nil},
		{"no newline", "%s", false, nil},
		{"flag wins over DLOCK_URL", "%s\n", true, map[string]string{"DLOCK_URL": "nosuch://x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, b := authURL()
			path := writeURLFile(t, fmt.Sprintf(tc.content, raw), 0o600)
			vars := map[string]string{}
			for k, v := range tc.vars {
				vars[k] = v
			}
			var src []string
			if tc.flag {
				src = []string{"--url-file", path}
			} else {
				vars["DLOCK_URL_FILE"] = path
			}
			te := newTestEnv(vars)
			if code := te.run(append(append([]string{"run"}, src...), "x", "--", "true")...); code != 0 {
				t.Fatalf("run: exit %d: %s", code, te.stderr.String())
			}
			if b.Calls("acquire") != 1 {
				t.Fatalf("backend saw %d acquires, want 1", b.Calls("acquire"))
			}
			te = newTestEnv(vars)
			if code := te.run(append([]string{"status", "--json"}, src...)...); code != 0 || !strings.Contains(te.stdout.String(), `"name": "x"`) {
				t.Fatalf("status: exit %d, stdout %q, stderr %q", code, te.stdout.String(), te.stderr.String())
			}
			if te.stderr.String() != "" {
				t.Fatalf("status printed %q on stderr, want nothing", te.stderr.String())
			}
		})
	}
}

// TestURLFileBadInput: a URL file that cannot be read, is empty, too large
// or not one line is bad input (exit 64), named with the flag or variable
// that gave it; what it holds is never printed.
func TestURLFileBadInput(t *testing.T) {
	dir := t.TempDir()
	good, _ := authURL()
	file := func(content string) string { return writeURLFile(t, content, 0o600) }
	for _, tc := range []struct {
		name string
		args []string
		vars map[string]string
		want []string // in the message
	}{
		{"missing file", []string{"run", "--url-file", filepath.Join(dir, "nope"), "x", "--", "true"}, nil,
			[]string{"--url-file", "nope", "cannot read the URL file", "no such file"}},
		{"missing file from the variable", []string{"status"}, map[string]string{"DLOCK_URL_FILE": filepath.Join(dir, "nope")},
			[]string{"$DLOCK_URL_FILE", "nope", "no such file"}},
		{"empty", []string{"status", "--url-file", file("")}, nil, []string{"--url-file", "is empty"}},
		{"blank lines only", []string{"status", "--url-file", file("\n \n")}, nil, []string{"is empty"}},
		{"two lines", []string{"status", "--url-file", file(good + "\n" + good + "\n")}, nil, []string{"more than one line"}},
		{"directory", []string{"status", "--url-file", dir}, nil, []string{"not a regular file"}},
		{"too large", []string{"status", "--url-file", file(good + "?" + strings.Repeat("x", 70<<10))}, nil, []string{"larger than 64 KiB"}},
		{"bare password", []string{"status", "--url-file", file(authSecret + "\n")}, nil, []string{"no scheme"}},
		{"both flags", []string{"status", "--url", good, "--url-file", file(good)}, nil, []string{"--url or --url-file, not both"}},
		{"both variables", []string{"status"}, map[string]string{"DLOCK_URL": good, "DLOCK_URL_FILE": file(good)},
			[]string{"both $DLOCK_URL and $DLOCK_URL_FILE"}},
		{"check", []string{"check", "--url-file", file("\n")}, nil, []string{"--url-file", "is empty"}},
		{"bench", []string{"bench", "--url-file", file("")}, nil, []string{"--url-file", "is empty"}},
		{"check with --spawn too", []string{"check", "--url-file", file(good), "--spawn", "redis"}, nil, []string{"exactly one of"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestEnv(tc.vars)
			if code := te.run(tc.args...); code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr: %s", code, exitUsage, te.stderr.String())
			}
			out := te.stdout.String() + te.stderr.String()
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output %q does not contain %q", out, w)
				}
			}
			if strings.Contains(out, authSecret) || strings.Contains(out, "clitest") {
				t.Errorf("output %q shows what the file holds", out)
			}
		})
	}
	t.Run("unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads a file of mode 0000")
		}
		te := newTestEnv(nil)
		path := writeURLFile(t, good, 0)
		if code := te.run("status", "--url-file", path); code != exitUsage || !strings.Contains(te.stderr.String(), "permission denied") {
			t.Fatalf("exit %d, stderr %q; want 64 and permission denied", code, te.stderr.String())
		}
	})
}

// TestURLFileCredentialsNeverPrinted extends TestCredentialsNeverPrinted to
// the file routes: a backend's error that echoes the URL shows no password.
func TestURLFileCredentialsNeverPrinted(t *testing.T) {
	const secret = "hunter2-s3cret"
	for _, tc := range []struct {
		content string
		code    int    // the error of the URL in the file
		want    string // in the message
	}{
		{"test-leaky://alice:" + secret + "@db.example/x\n", exitUnavailable, "cannot log in to test-leaky://alice:xxxxx@db.example/x"},
		{"test-leaky://db.example/x?password=" + secret + "\n", exitUnavailable, "password=xxxxx"},
		{"test-auth://:" + secret + "@x\n", exitUnavailable, "authentication failed"}, // wrong password
		{"nosuch://alice:" + secret + "@db.example/x", exitUsage, `unknown scheme "nosuch"`},
	} {
		path := writeURLFile(t, tc.content, 0o600)
		for _, te := range []*testEnv{newTestEnv(nil), newTestEnv(map[string]string{"DLOCK_URL_FILE": path})} {
			args := []string{"status"}
			if te.vars["DLOCK_URL_FILE"] == "" {
				args = append(args, "--url-file", path)
			}
			code := te.run(args...)
			out := te.stdout.String() + te.stderr.String()
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Errorf("%q %v: exit %d, output %q; want %d and %q", tc.content, args, code, out, tc.code, tc.want)
			}
			if strings.Contains(out, "s3cret") || !strings.HasPrefix(out, "dlock: ") {
				t.Errorf("%q %v: output %q shows the password (or is not a dlock: message)", tc.content, args, out)
			}
		}
	}
}

// TestURLFileWarnings: a password in --url, or in a URL file other users may
// read, draws a warning on stderr; the command still runs.
func TestURLFileWarnings(t *testing.T) {
	raw, _ := authURL()
	plain, _ := memURL()
	for _, tc := range []struct {
		name string
		args func(t *testing.T) []string
		warn string // "" for no warning
	}{
		{"password in --url", func(*testing.T) []string { return []string{"--url", raw} }, "other users can read the password in --url"},
		{"no password in --url", func(*testing.T) []string { return []string{"--url", plain} }, ""},
		{"file of mode 0600", func(t *testing.T) []string { return []string{"--url-file", writeURLFile(t, raw, 0o600)} }, ""},
		{"file of mode 0640", func(t *testing.T) []string { return []string{"--url-file", writeURLFile(t, raw, 0o640)} }, "other users may read it (mode 0640); chmod 600 it"},
		{"file of mode 0644 without password", func(t *testing.T) []string { return []string{"--url-file", writeURLFile(t, plain, 0o644)} }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestEnv(nil)
			if code := te.run(append([]string{"status"}, tc.args(t)...)...); code != 0 {
				t.Fatalf("exit %d: %s", code, te.stderr.String())
			}
			stderr := te.stderr.String()
			switch {
			case tc.warn == "" && stderr != "":
				t.Fatalf("stderr %q, want nothing", stderr)
			case tc.warn != "" && (!strings.HasPrefix(stderr, "dlock: warning: ") || !strings.Contains(stderr, tc.warn)):
				t.Fatalf("stderr %q, want a warning containing %q", stderr, tc.warn)
			case strings.Contains(stderr, authSecret):
				t.Fatalf("stderr %q shows the password", stderr)
			}
		})
	}
}

// TestRunWithholdsCredentials: CMD's environment holds neither DLOCK_URL nor
// DLOCK_URL_FILE nor the password, whichever route gave dlock the URL.
// Other variables pass through.
func TestRunWithholdsCredentials(t *testing.T) {
	raw, _ := authURL()
	path := writeURLFile(t, raw+"\n", 0o600)
	for _, tc := range []struct {
		name     string
		args     []string
		vars     map[string]string
		withheld string // DLOCK_URL_WITHHELD for CMD
	}{
		{"DLOCK_URL", nil, map[string]string{"DLOCK_URL": raw}, "DLOCK_URL"},
		{"DLOCK_URL_FILE", nil, map[string]string{"DLOCK_URL_FILE": path}, "DLOCK_URL_FILE"},
		{"--url-file, DLOCK_URL set too", []string{"--url-file", path}, map[string]string{"DLOCK_URL": raw}, "DLOCK_URL"},
		{"--url", []string{"--url", raw}, map[string]string{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.vars["KEEP_ME"] = "yes"
			te := newTestEnv(tc.vars)
			args := append(append([]string{"run"}, tc.args...), "env/lock", "--", "env")
			if code := te.run(args...); code != 0 {
				t.Fatalf("exit %d: %s", code, te.stderr.String())
			}
			env := te.stdout.String()
			for _, bad := range []string{"DLOCK_URL=", "DLOCK_URL_FILE=", authSecret} {
				if strings.Contains(env, bad) {
					t.Errorf("CMD's environment holds %q:\n%s", bad, env)
				}
			}
			for _, want := range []string{"\nKEEP_ME=yes\n", "\nDLOCK_NAME=env/lock\n", "\nDLOCK_TOKEN="} {
				if !strings.Contains("\n"+env, want) {
					t.Errorf("CMD's environment lacks %q:\n%s", strings.TrimSpace(want), env)
				}
			}
			has := strings.Contains(env, "DLOCK_URL_WITHHELD=")
			if has != (tc.withheld != "") || has && !strings.Contains("\n"+env, "\nDLOCK_URL_WITHHELD="+tc.withheld+"\n") {
				t.Errorf("CMD's environment: want DLOCK_URL_WITHHELD=%q:\n%s", tc.withheld, env)
			}
		})
	}
}

// TestNestedDlockNeedsURL: a dlock that CMD runs, under a dlock run that
// kept DLOCK_URL from it, does not fall back to the default SQLite file (a
// different backend): it asks for --url-file, and works when given one.
func TestNestedDlockNeedsURL(t *testing.T) {
	raw, b := authURL()
	path := writeURLFile(t, raw, 0o600)
	home := t.TempDir()
	inner := map[string]string{"HOME": home, "DLOCK_URL_WITHHELD": "DLOCK_URL"}
	te := newTestEnv(inner)
	if code := te.run("run", "x", "--", "true"); code != exitUsage || !strings.Contains(te.stderr.String(), "kept $DLOCK_URL from its command: give --url-file FILE or set $DLOCK_URL_FILE") {
		t.Fatalf("exit %d, stderr %q; want 64 asking for --url-file", code, te.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(home, ".local")); err == nil {
		t.Fatal("the default state directory was created")
	}
	te = newTestEnv(inner)
	if code := te.run("run", "--url-file", path, "x", "--", "true"); code != 0 || b.Calls("acquire") != 1 {
		t.Fatalf("with --url-file: exit %d, %d acquires; stderr %q", code, b.Calls("acquire"), te.stderr.String())
	}
	inner["DLOCK_URL_FILE"] = path
	te = newTestEnv(inner)
	if code := te.run("status"); code != 0 {
		t.Fatalf("with DLOCK_URL_FILE: exit %d, stderr %q", code, te.stderr.String())
	}
}

// TestProcessCredentialsHidden: dlock processes against a Redis that requires
// a password, given by --url-file, $DLOCK_URL_FILE or $DLOCK_URL. The
// password shows in no process's command line (dlock's, its guard's, CMD's),
// and CMD's environment holds neither it nor DLOCK_URL nor DLOCK_URL_FILE.
func TestProcessCredentialsHidden(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	srv := testserver.Redis(t, nil)
	if srv.External() {
		t.Skip("sets a password on the server")
	}
	secret := "pw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	err := rc.ConfigSet(context.Background(), "requirepass", secret).Err()
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	rawURL := "redis://:" + secret + "@" + srv.Addr() + "/0"
	path := writeURLFile(t, rawURL+"\n", 0o600)
	base := bareProcEnv(t)

	// Without the password, the server refuses dlock.
	cmd, out := startDlockEnv(t, base, "status", "--url", "redis://"+srv.Addr()+"/0")
	if code := waitExit(t, cmd, time.Minute); code != exitUnavailable {
		t.Fatalf("status without the password: exit %d, want %d: %s", code, exitUnavailable, out)
	}

	for i, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{"--url-file", []string{"--url-file", path}, nil},
		{"DLOCK_URL_FILE", nil, []string{"DLOCK_URL_FILE=" + path}},
		{"DLOCK_URL", nil, []string{"DLOCK_URL=" + rawURL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			environ := append(slices.Clip(base), tc.env...)
			dir := t.TempDir()
			envFile, pidFile, release := filepath.Join(dir, "env"), filepath.Join(dir, "pid"), filepath.Join(dir, "release")
			name := fmt.Sprintf("creds/%d", i)
			args := append(append([]string{"run"}, tc.args...), name, "--", "sh", "-c",
				`env > "$1.tmp"; mv "$1.tmp" "$1"; echo $$ > "$2.tmp"; mv "$2.tmp" "$2"; while [ ! -e "$3" ]; do sleep 0.01; done`,
				"sh", envFile, pidFile, release)
			cmd, out := startDlockEnv(t, environ, args...)
			waitFor(t, "CMD to start", time.Minute, fileExists(pidFile))
			cmdPid, err := strconv.Atoi(readFile(t, pidFile))
			if err != nil {
				t.Fatal(err)
			}
			for what, pid := range map[string]int{"dlock": cmd.Process.Pid, "the guard": parentOf(cmdPid), "CMD": cmdPid} {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), secret) {
					t.Errorf("the command line of %s shows the password: %q", what, b)
				}
			}
			env := readFile(t, envFile)
			for _, bad := range []string{"DLOCK_URL=", "DLOCK_URL_FILE=", secret} {
				if strings.Contains(env, bad) {
					t.Errorf("CMD's environment holds %q:\n%s", bad, env)
				}
			}
			if !strings.Contains(env, "DLOCK_NAME="+name) {
				t.Errorf("CMD's environment lacks DLOCK_NAME:\n%s", env)
			}
			// The lock is held on the server that wants the password.
			st, stOut := startDlockEnv(t, base, "status", "-v", "--json", "--url-file", path, name)
			if code := waitExit(t, st, time.Minute); code != 0 || !strings.Contains(stOut.String(), `"count": 1`) {
				t.Errorf("status: exit %d, output %s; want the lock held", code, stOut)
			}
			if want := "dlock: backend redis://:xxxxx@" + srv.Addr() + "/0; tls: none"; !strings.Contains(stOut.String(), want) || strings.Contains(stOut.String(), secret) {
				t.Errorf("status -v: output %s; want %q and no password", stOut, want)
			}
			if err := os.WriteFile(release, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd, time.Minute); code != 0 {
				t.Fatalf("dlock run: exit %d: %s", code, out)
			}
			if strings.Contains(out.String(), secret) {
				t.Fatalf("dlock printed the password: %s", out)
			}
		})
	}
}

// TestProcessNestedDlock: dlock processes run by CMD under a dlock run whose
// backend came from DLOCK_URL: without a URL they exit 64 rather than use
// the default file; with --url-file they reach the outer lock's backend.
func TestProcessNestedDlock(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	path := writeURLFile(t, dbURL+"\n", 0o600)
	bin := dlockBinary(t)
	cmd, out := startDlock(t, dbURL, "run", "outer", "--", "sh", "-c",
		`"$0" status; echo "status exit $?"; "$0" status --url-file "$1" --json; echo "file exit $?"`, bin, path)
	if code := waitExit(t, cmd, time.Minute); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	got := out.String()
	for _, want := range []string{"kept $DLOCK_URL from its command", "status exit 64", `"name": "outer"`, "file exit 0"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
