package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// startLockServer serves rawURL's locks on an httptest server for the test.
func startLockServer(t *testing.T, rawURL, prefix string, interval time.Duration) (*lockServer, *httptest.Server) {
	t.Helper()
	s := newLockServer(openClient(t, rawURL), shownURL(rawURL), prefix, interval)
	ts := httptest.NewServer(s.handler())
	t.Cleanup(func() {
		s.stop()
		ts.Close()
	})
	return s, ts
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b)
}

// TestServeMetrics: /metrics exports each lock of the prefix with its holder,
// token, hold count and time left, the kinds' own series, and the process
// metrics; a free lock keeps its token and has no expiry series.
func TestServeMetrics(t *testing.T) {
	u, _ := sqliteTestURL(t)
	c := openClient(t, u)
	ctx := context.Background()
	held, err := c.NewMutex("jobs/held", &dlock.MutexOptions{TTL: 30 * time.Second}).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	free, err := c.NewMutex("jobs/free", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	freeToken := free.Token()
	if err := free.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	sem, err := c.NewSemaphore("jobs/sem", 3, nil).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Unlock(ctx)
	if _, err := c.NewMutex("other", nil).TryLock(ctx); err != nil {
		t.Fatal(err)
	}

	s, ts := startLockServer(t, u, "jobs/", time.Second)
	body := httpGet(t, ts.URL+"/metrics")
	for _, want := range []string{
		`dlock_inspect_up 1`,
		`dlock_lock_held{name="jobs/held",type="mutex"} 1`,
		`dlock_lock_holder_info{name="jobs/held",owner="` + held.Owner() + `",type="mutex"} 1`,
		`dlock_lock_token{name="jobs/held",type="mutex"} ` + itoa(held.Token()),
		`dlock_lock_holds{name="jobs/held",type="mutex"} 1`,
		`dlock_lock_held{name="jobs/free",type="mutex"} 0`,
		`dlock_lock_token{name="jobs/free",type="mutex"} ` + itoa(freeToken),
		`dlock_lock_held{name="jobs/sem",type="semaphore"} 1`,
		`dlock_lock_permits{name="jobs/sem",type="semaphore"} 3`,
		`dlock_lock_permits_taken{name="jobs/sem",type="semaphore"} 1`,
		`dlock_build_info{`,
		`process_open_fds `,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, absent := range []string{`name="other"`, `dlock_lock_expires_in_seconds{name="jobs/free"`, `dlock_lock_holder_info{name="jobs/free"`} {
		if strings.Contains(body, absent) {
			t.Errorf("/metrics has %q", absent)
		}
	}
	// The held lock's time left is its TTL's, give or take the test's pace.
	if v := metricValue(t, body, `dlock_lock_expires_in_seconds{name="jobs/held",type="mutex"}`); v <= 0 || v > 30 {
		t.Errorf("expires_in_seconds of a 30s lease = %v", v)
	}
	// After the release, the next scrape shows it free with the same token.
	tok := held.Token()
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	body = httpGet(t, ts.URL+"/metrics")
	for _, want := range []string{`dlock_lock_held{name="jobs/held",type="mutex"} 0`, `dlock_lock_token{name="jobs/held",type="mutex"} ` + itoa(tok)} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics after release lacks %q", want)
		}
	}
	// The metrics pass Prometheus's own linter (names, units, help).
	if problems, err := testutil.GatherAndLint(s.reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// metricValue reads the value of the series line that starts with series.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no series %s in\n%s", series, body)
	return 0
}

// TestServeMetricsBackendDown: a backend that stops answering makes
// dlock_inspect_up 0 and drops the per-lock series, rather than failing the
// scrape: the process metrics still arrive. The page's snapshot says why.
func TestServeMetricsBackendDown(t *testing.T) {
	srv := testserver.Redis(t, nil)
	u := srv.URL()
	holdLock(t, u, "x", nil)
	s, ts := startLockServer(t, u, "", time.Hour)
	if body := httpGet(t, ts.URL+"/metrics"); !strings.Contains(body, "dlock_inspect_up 1") || !strings.Contains(body, `dlock_lock_held{name="x",type="mutex"} 1`) {
		t.Fatalf("/metrics with the backend up:\n%s", body)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	body := httpGet(t, ts.URL+"/metrics")
	if !strings.Contains(body, "dlock_inspect_up 0") || strings.Contains(body, "dlock_lock_held") || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics with the backend down:\n%s", body)
	}
	s.refresh()
	var snap snapshot
	if err := json.Unmarshal([]byte(httpGet(t, ts.URL+"/api/locks")), &snap); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(snap.Error, "dlock: ") || len(snap.Locks) != 1 || snap.Locks[0].Name != "x" {
		t.Errorf("snapshot with the backend down: %+v (want its error and the last good reading)", snap)
	}
}

// TestServeEvents: /events streams snapshots as server-sent events, the
// first at once and the next after a change.
func TestServeEvents(t *testing.T) {
	u, _ := sqliteTestURL(t)
	l := holdLock(t, u, "a", nil)
	_, ts := startLockServer(t, u, "", 100*time.Millisecond)
	resp, err := http.Get(ts.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := make(chan snapshot)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var s snapshot
			if err := json.Unmarshal([]byte(data), &s); err != nil {
				t.Errorf("event %q: %v", data, err)
				return
			}
			events <- s
		}
	}()
	next := func(cond func(snapshot) bool) snapshot {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case s, ok := <-events:
				if !ok {
					t.Fatal("event stream ended")
				}
				if cond(s) {
					return s
				}
			case <-deadline:
				t.Fatal("no such event within 20s")
			}
		}
	}
	s := next(func(s snapshot) bool { return len(s.Locks) == 1 && s.Locks[0].Owner != "" })
	if s.Locks[0].Name != "a" || s.Locks[0].Owner != l.Owner() || s.Locks[0].Token != l.Token() || s.Error != "" {
		t.Errorf("first event %+v", s)
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	s = next(func(s snapshot) bool { return len(s.Locks) == 1 && s.Locks[0].Owner == "" })
	if s.Locks[0].Token != l.Token() || s.Locks[0].Count != 0 {
		t.Errorf("event after release %+v", s.Locks[0])
	}
	// /api/locks answers with the same snapshot.
	var api snapshot
	if err := json.Unmarshal([]byte(httpGet(t, ts.URL+"/api/locks")), &api); err != nil || len(api.Locks) != 1 || api.Locks[0].Name != "a" {
		t.Errorf("/api/locks: %+v %v", api, err)
	}
}

// TestServePageChromium opens the live page in headless Chromium and
// watches a lock that another dlock process takes appear as held, with its
// holder and token, and turn free when that process ends.
// DLOCK_SERVE_SCREENSHOT=FILE saves a screenshot of the page while the lock
// is held (docs/serve.png is made that way).
func TestServePageChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (Debian package chromium; scripts/install-deps.sh installs it)")
	}
	u, _ := sqliteTestURL(t)
	c := openClient(t, u)
	ctx := context.Background()
	// Some company for the lock under test, so that the page shows each
	// type: a free lock with its last token, a held mutex, a semaphore and
	// a read/write lock held by readers.
	nl, err := c.NewMutex("nightly-report", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	long := &dlock.MutexOptions{TTL: 10 * time.Minute}
	if _, err := c.NewMutex("deploy/prod", long).TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.NewSemaphore("encoders", 4, long).TryAcquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := c.NewRWMutex("config", long).TryRLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, ts := startLockServer(t, u, "", 200*time.Millisecond)

	dir := t.TempDir()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(bin),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(filepath.Join(dir, "profile")),
		chromedp.WindowSize(1100, 420),
		chromedp.Env("HOME="+dir),
	)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The first Run starts the browser and lives as long as bctx: no
	// deadline on it; each step below has its own.
	if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/")); err != nil {
		t.Fatal(err)
	}
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// text reads the text of sel's element in one evaluation in the page:
	// the page rebuilds its rows on every update, and chromedp.Text, which
	// finds the node first and reads it after, read "" from a row replaced
	// in between (seen once in make test).
	text := func(sel string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 20*time.Second)
		defer cancel()
		js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.innerText : ""; })()`, sel)
		s, err := chromedp.Run(sctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	step("page shows the locks", chromedp.WaitVisible(chromedp.CSS(`tr.held[data-name="deploy/prod"]`)))
	if got := text(`#conn`); got != "live" {
		t.Errorf("connection state %q", got)
	}
	step("no job/a yet", chromedp.WaitNotPresent(chromedp.CSS(`tr[data-name="job/a"]`)))

	// Another process takes job/a and holds it until told to stop.
	work := t.TempDir()
	started, stop := filepath.Join(work, "started"), filepath.Join(work, "stop")
	script := `echo "$DLOCK_TOKEN" > "$0.tmp" && mv "$0.tmp" "$0"; until [ -e "$1" ]; do sleep 0.05; done`
	cmd, out := startDlock(t, u, "run", "--ttl", "20s", "job/a", "--", "sh", "-c", script, started, stop)
	waitFor(t, "the other process to hold job/a", 20*time.Second, fileExists(started))
	token := readFile(t, started)
	step("job/a appears as held", chromedp.WaitVisible(chromedp.CSS(`tr.held[data-name="job/a"]`)))
	row := text(`tr[data-name="job/a"]`)
	if !strings.Contains(row, "held") || !strings.Contains(row, token) {
		t.Errorf("row of the held lock %q lacks held and token %s", row, token)
	}
	if holder := text(`tr[data-name="job/a"] td.holder`); len(holder) < 8 || holder == "–" {
		t.Errorf("holder cell %q", holder)
	}
	if left := text(`tr[data-name="job/a"] td.left`); !strings.HasSuffix(left, "s") {
		t.Errorf("time left cell %q", left)
	}
	if keep := os.Getenv("DLOCK_SERVE_SCREENSHOT"); keep != "" {
		sctx, cancel := context.WithTimeout(bctx, 20*time.Second)
		err := chromedp.Do(sctx, chromedp.EmulateViewport(1100, 470))
		var png []byte
		if err == nil {
			png, err = chromedp.Run(sctx, chromedp.CaptureScreenshot())
		}
		cancel()
		if err == nil {
			err = os.WriteFile(keep, png, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 0 {
		t.Fatalf("dlock run exited %d: %s", code, out)
	}
	step("job/a turns free", chromedp.WaitVisible(chromedp.CSS(`tr.free[data-name="job/a"]`)))
	if row := text(`tr[data-name="job/a"]`); !strings.Contains(row, "free") || !strings.Contains(row, token) {
		t.Errorf("row of the released lock %q lacks free and its last token %s", row, token)
	}
	if err := chromedp.Cancel(bctx); err != nil {
		t.Errorf("closing the browser: %v", err)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// TestServeCommand runs "dlock serve" on a free port, reads the address it
// prints, scrapes it, and stops it with SIGTERM (exit 0). Bad input exits 64.
func TestServeCommand(t *testing.T) {
	u, _ := sqliteTestURL(t)
	holdLock(t, u, "cmd/a", nil)
	te := newTestEnv(map[string]string{envURL: u})
	done := make(chan error, 1)
	go func() { done <- serveCmdRun(te, "--listen", "127.0.0.1:0", "--prefix", "cmd/") }()
	var addr string
	waitFor(t, "serve to print its address", 20*time.Second, func() bool {
		_, rest, ok := strings.Cut(te.stderr.String(), "serving http://")
		addr, _, _ = strings.Cut(rest, "/")
		return ok && strings.Contains(rest, "/")
	})
	if body := httpGet(t, "http://"+addr+"/metrics"); !strings.Contains(body, `dlock_lock_held{name="cmd/a",type="mutex"} 1`) {
		t.Errorf("/metrics:\n%s", body)
	}
	if page := httpGet(t, "http://"+addr+"/"); !strings.Contains(page, "new EventSource(") || strings.Contains(page, "src=\"http") {
		t.Errorf("page is not the self-contained live page")
	}
	te.sigs <- syscall.SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop within 20s of SIGTERM")
	}

	for _, args := range [][]string{{"--interval", "1ms"}, {"--listen", "256.0.0.1:x"}, {"extra"}} {
		var ee *exitError
		if err := serveCmdRun(newTestEnv(map[string]string{envURL: u}), args...); !errors.As(err, &ee) || ee.code != exitUsage {
			t.Errorf("serve %q: %v, want exit %d", args, err, exitUsage)
		}
	}
	var ee *exitError
	if err := serveCmdRun(newTestEnv(map[string]string{envURL: "test-noinspect://x"}), "--listen", "127.0.0.1:0"); !errors.As(err, &ee) || ee.code != exitUnavailable {
		t.Errorf("serve on a backend without Inspect: %v, want exit %d", err, exitUnavailable)
	}
}

// serveCmdRun runs the serve command in-process.
func serveCmdRun(te *testEnv, args ...string) error {
	cmd := newServeCmd(te.env())
	cmd.SetArgs(args)
	cmd.SetOut(&te.stdout)
	cmd.SetErr(&te.stderr)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	return cmd.Execute()
}
