package check

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// synthRun simulates a 20 s run of 3 workers × 2 goroutines on 2 locks with
// a paused holder, a killed holder and a server restarted without its data
// (which resets tokens: admitted violations), plus one overlap the docs do
// not admit, so every kind of mark appears in the picture.
func synthRun(seed uint64) *History {
	rng := rand.New(rand.NewPCG(seed, 1))
	ttl := time.Second
	h := &History{Backend: "redis", URL: "redis://127.0.0.1:6379", TTL: ttl, Workers: 3, Goroutines: 2,
		Locks: []string{"orders", "stock"}, Start: t0, End: ms(20000),
		Faults: []string{FaultPauseHolder, FaultKillHolder, FaultRestartWiped}}
	add := func(e Event) { e.Wall = time.Unix(0, e.Mono); h.Events = append(h.Events, e) }
	fault := func(name, target string, from, to int) {
		add(Event{Kind: KindFaultStart, Mono: ms(from), Worker: -1, Fault: name, Target: target})
		add(Event{Kind: KindFaultEnd, Mono: ms(to), Worker: -1, Fault: name, Target: target})
	}
	fault(FaultPauseHolder, "worker 1", 4000, 5600)
	fault(FaultKillHolder, "worker 2", 9000, 9050)
	fault(FaultRestartWiped, "server 0", 14000, 14300)
	type who struct{ w, g int }
	var op int64
	for li, lock := range h.Locks {
		next := map[who]int{}
		for w := 0; w < 3; w++ {
			for g := 0; g < 2; g++ {
				next[who{w, g}] = rng.IntN(100)
			}
		}
		pending := map[who]int64{}
		token := uint64(100 * (li + 1))
		cur := 0
		for cur < 19500 {
			// the contender whose request is oldest
			var c who
			best := 1 << 30
			for k, t := range next {
				if t < best || (t == best && (k.w < c.w || (k.w == c.w && k.g < c.g))) {
					c, best = k, t
				}
			}
			for k, t := range next {
				if _, ok := pending[k]; !ok && t < 19500 {
					op++
					pending[k] = op
					add(Event{Kind: KindRequest, Mono: ms(t), Worker: k.w, Goroutine: k.g, Lock: lock, Op: op})
				}
			}
			o := pending[c]
			delete(pending, c)
			g := max(cur, best) + 1 + rng.IntN(3)
			if g >= 14000 && g < 14300 {
				g = 14300 + rng.IntN(20) // the server is down
			}
			token++
			if g >= 14300 && token > 50 && li == 0 {
				token = 1 // restarted without its data
			}
			hold := 60 + rng.IntN(350)
			vu := g + int(ttl/time.Millisecond) - 12
			add(Event{Kind: KindGrant, Mono: ms(g), Worker: c.w, Goroutine: c.g, Lock: lock, Op: o, Token: token, ValidUntil: ms(vu)})
			e := func(k Kind, at int, f func(*Event)) {
				ev := Event{Kind: k, Mono: ms(at), Worker: c.w, Goroutine: c.g, Lock: lock, Op: o}
				if f != nil {
					f(&ev)
				}
				add(ev)
			}
			write := func(at, vu int, ok bool) {
				e(KindWrite, at, func(ev *Event) { ev.Token, ev.ValidUntil, ev.Accepted = token, ms(vu), ok })
			}
			switch {
			case li == 0 && c.w == 1 && g > 3700 && g < 4000:
				// paused from 4.0 s to 5.6 s: loses its lease, writes late
				write(g+5, vu, true)
				e(KindValid, 3990, func(ev *Event) { ev.ValidUntil = ms(vu) })
				write(5600, vu, false)
				e(KindDone, 5601, func(ev *Event) { ev.Err = "dlock: lease lost" })
				e(KindUnlockStart, 5602, nil)
				e(KindUnlockEnd, 5604, func(ev *Event) { ev.Err = "dlock: unlock: not held" })
				cur = vu + 5
				next[c] = 5700
			case c.w == 2 && g > 8700 && g < 9000:
				write(g+5, vu, true)
				cur = vu + 5 // the killed holder's key expires
				next[c] = 9300
			case li == 1 && g > 11000 && g < 11500 && c.g == 0:
				// an overlap the docs do not admit: the next holder is
				// granted while this one's lease runs
				write(g+5, vu, true)
				e(KindUnlockStart, g+hold, nil)
				e(KindUnlockEnd, g+hold+2, nil)
				cur = g + hold/2
				next[c] = g + hold + 30 + rng.IntN(150)
			default:
				for i, n := 0, 1+rng.IntN(3); i < n; i++ {
					write(g+5+i*hold/4, vu, true)
				}
				e(KindUnlockStart, g+hold, nil)
				e(KindUnlockEnd, g+hold+1+rng.IntN(2), nil)
				cur = g + hold + 2
				next[c] = g + hold + 30 + rng.IntN(150)
			}
		}
	}
	slices.SortStableFunc(h.Events, func(x, y Event) int { return int(x.Mono - y.Mono) })
	return h
}

func TestWriteHTML(t *testing.T) {
	h := synthRun(1)
	r := Analyze(h)
	if !r.Failed() {
		t.Fatal("the synthetic run's unadmitted overlap was not reported")
	}
	if n, adm := count(r, ClassTokenOrder); n == 0 || adm != n {
		t.Errorf("token-order after the wiped restart: %d, %d admitted; want all admitted", n, adm)
	}
	var buf bytes.Buffer
	if err := WriteHTML(&buf, h, r); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, s := range []string{"<!DOCTYPE html>", "<svg", "FAIL", "lock orders", "pause-holder worker 1", "restart-wiped", "validity-overlap", "admitted by the docs", "refused by the fence"} {
		if !strings.Contains(page, s) {
			t.Errorf("page lacks %q", s)
		}
	}
	// self-contained: nothing is fetched
	for _, s := range []string{"http://", "https://", "<script", "@import", "url(http"} {
		if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), s) {
			t.Errorf("page contains %q", s)
		}
	}
	// untrusted text is escaped
	h2 := &History{Backend: "<b>x</b>", Locks: []string{"<script>"}, Events: []Event{
		{Kind: KindRequest, Mono: 1, Lock: "<script>", Op: 1},
		{Kind: KindGrant, Mono: 2, Lock: "<script>", Op: 1, Token: 1, ValidUntil: 1e9},
		{Kind: KindPanic, Mono: 3, Err: "<img src=x>"},
	}}
	buf.Reset()
	if err := WriteHTML(&buf, h2, nil); err != nil {
		t.Fatal(err)
	}
	if s := buf.String(); strings.Contains(s, "<script>") || strings.Contains(s, "<img") || strings.Contains(s, "<b>x") {
		t.Errorf("unescaped input in the page")
	}
}

// TestHTMLChromium renders the synthetic run's page in headless Chromium and
// checks a screenshot was written. DLOCK_CHECK_SCREENSHOT=FILE keeps it.
func TestHTMLChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed (Debian package chromium; scripts/install-deps.sh)")
		}
		t.Skip("chromium is not installed")
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "timeline.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	h := synthRun(1)
	if err := WriteHTML(f, h, Analyze(h)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "timeline.png")
	if err := screenshot(bin, dir, page, png); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(png)
	if err != nil || st.Size() < 10_000 {
		t.Fatalf("screenshot %v, %v", st, err)
	}
	if keep := os.Getenv("DLOCK_CHECK_SCREENSHOT"); keep != "" {
		b, err := os.ReadFile(png)
		if err == nil {
			err = os.WriteFile(keep, b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// screenshot runs headless Chromium on page with networking off and writes a
// 1400×900 PNG.
func screenshot(bin, dir, page, png string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--screenshot="+png, "--window-size=1400,900",
		"file://"+page)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("chromium: %v\n%s", err, out)
	}
	return nil
}
