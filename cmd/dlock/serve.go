package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/dlockprom"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
)

const serveLong = `Serve shows the locks whose names start with --prefix (all if omitted) over
HTTP, for dashboards and for an operator to leave open:

  /metrics      Prometheus text format: per lock whether it is held, its
                holder, last token, time left and waiters (where the backend
                knows), and the process's own metrics. The backend is read
                when Prometheus scrapes.
  /             a live page of the locks: held or free, holder, token, time
                left and waiters, refreshed every --interval by server-sent
                events. It needs no external assets.
  /events       the page's event stream: one JSON snapshot per --interval
                ("locks" holds what "dlock status --json" prints)
  /api/locks    the latest snapshot as JSON

It listens on 127.0.0.1:9090 by default. The page and the metrics show lock
names, owner ids and tokens, never the backend's password; bind it to a
non-loopback address only where every client may see those.

SIGINT or SIGTERM stops it (exit 0). Exit codes: 0 stopped by a signal; 64
bad flag or URL, or an address it cannot listen on; 69 backend unreachable
at start, or unable to list its locks.`

// serveFlags are the settings of one "dlock serve".
type serveFlags struct {
	url      urlFlags
	listen   string
	prefix   string
	interval time.Duration
}

// inspectTimeout bounds one Inspect made for the page or a scrape.
const inspectTimeout = 10 * time.Second

// shutdownTimeout bounds the HTTP server's graceful stop.
const shutdownTimeout = 5 * time.Second

func newServeCmd(e *env) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Serve Prometheus metrics and a live page of the locks",
		Long:  serveLong,
		Example: `  dlock serve
  dlock serve --listen 127.0.0.1:9090 --url etcd://h1:2379 --prefix jobs/`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErr(fmt.Errorf("serve: takes no arguments (use --prefix P), got %q", args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.interval < 100*time.Millisecond {
				return usageErr(fmt.Errorf("serve: --interval must be at least 100ms, got %v", f.interval))
			}
			return f.run(e)
		},
	}
	f.url.register(cmd, defaultURLHelp)
	f.url.registerConnect(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:9090", "address to serve HTTP on (host:port; port 0 picks a free one)")
	fl.StringVar(&f.prefix, "prefix", "", "show only locks whose names start with this")
	fl.DurationVar(&f.interval, "interval", time.Second, "how often the page's snapshot is refreshed")
	return cmd
}

func (f *serveFlags) run(e *env) error {
	raw, err := f.url.backendURL(e, "serve")
	if err != nil {
		return err
	}
	reportBackend(e, raw, e.verbose)
	sigs, stopSigs := e.notify()
	defer stopSigs()

	// The process's own library metrics, beside the per-lock ones.
	metrics := dlockprom.New(nil)
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	op, err := f.url.openHooked(ctx, e, raw, metrics)
	cancel()
	if err != nil {
		return err
	}
	client := op.client
	defer client.Close()
	// A backend that cannot list its locks has nothing to serve.
	ctx, cancel = context.WithTimeout(context.Background(), inspectTimeout)
	_, err = client.Inspect(ctx, f.prefix)
	cancel()
	switch {
	case errors.Is(err, dlock.ErrUnsupported):
		return exitf(exitUnavailable, "serve: this backend cannot list its locks")
	case err != nil:
		return &exitError{code: exitUnavailable, err: err}
	}

	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return usageErr(fmt.Errorf("serve: --listen %s: %v", f.listen, err))
	}
	s := newLockServer(client, shownURL(raw), f.prefix, f.interval, metrics)
	var sc stopClient // for Ctrl-Z
	sc.set(client)
	defer s.stop()
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	e.warnf("dlock: serving http://%s/ (metrics at /metrics); Ctrl-C stops", ln.Addr())

	select {
	case err = <-served:
		return exitf(exitInternal, "serve: %v", err)
	case sig := <-sigs:
		if sig == syscall.SIGTSTP || sig == syscall.SIGCONT {
			// Job control: stop as the terminal asked; serving goes on after fg.
			for sig == syscall.SIGTSTP || sig == syscall.SIGCONT {
				if sig == syscall.SIGTSTP {
					sc.stop(e)
				}
				sig = <-sigs
			}
		}
		e.warnf("dlock: serve: %v, stopping", sig)
	}
	s.stop() // ends the event streams, which Shutdown would wait for
	ctx, cancel = context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	_ = srv.Shutdown(ctx)
	return nil
}

// shownURL is the backend URL with its secrets masked, for the page.
func shownURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return openurl.RedactURL(u)
}

// snapshot is one reading of the backend's locks, as the page and
// /api/locks show it.
type snapshot struct {
	// At is when the reading was taken, in Unix milliseconds.
	At      int64  `json:"at"`
	Backend string `json:"backend"`
	Prefix  string `json:"prefix"`
	// Error is why the reading failed ("" when it did not); Locks is then
	// the last good reading's.
	Error string     `json:"error,omitempty"`
	Locks []lockJSON `json:"locks"`
}

// lockServer serves the metrics, the page and its event stream over one
// Client. Its methods are safe for concurrent use.
type lockServer struct {
	client   *dlock.Client
	backend  string
	prefix   string
	interval time.Duration
	reg      *prometheus.Registry

	mu      sync.Mutex
	last    snapshot
	hasLast bool
	subs    map[chan snapshot]struct{}

	quit     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// newLockServer starts the poller that refreshes the page's snapshot every
// interval; stop ends it. extra are more collectors for /metrics (the
// Client's dlockprom metrics).
func newLockServer(c *dlock.Client, backend, prefix string, interval time.Duration, extra ...prometheus.Collector) *lockServer {
	s := &lockServer{
		client: c, backend: backend, prefix: prefix, interval: interval,
		reg:  prometheus.NewRegistry(),
		subs: map[chan snapshot]struct{}{},
		quit: make(chan struct{}),
	}
	s.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newLockCollector(c, prefix),
		buildInfoCollector(),
	)
	s.reg.MustRegister(extra...)
	s.wg.Add(1)
	go s.poll()
	return s
}

// stop ends the poller and every event stream. It is safe to call twice.
func (s *lockServer) stop() {
	s.stopOnce.Do(func() { close(s.quit) })
	s.wg.Wait()
}

func (s *lockServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /events", s.events)
	mux.HandleFunc("GET /api/locks", s.apiLocks)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		// The page is self-contained: its own inline script and style,
		// and a connection back to this server only.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(servePage)
	})
	return mux
}

// poll reads the backend every interval and hands the snapshot to the
// event streams.
func (s *lockServer) poll() {
	defer s.wg.Done()
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.refresh()
		select {
		case <-t.C:
		case <-s.quit:
			return
		}
	}
}

// refresh takes one snapshot and publishes it.
func (s *lockServer) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	infos, err := s.client.Inspect(ctx, s.prefix)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := snapshot{At: time.Now().UnixMilli(), Backend: s.backend, Prefix: s.prefix, Locks: []lockJSON{}}
	if err != nil {
		snap.Error = message(err)
		snap.Locks = s.last.Locks
	} else {
		for _, li := range infos {
			snap.Locks = append(snap.Locks, toJSON(li))
		}
	}
	s.last, s.hasLast = snap, true
	for c := range s.subs {
		// Each stream holds at most one pending snapshot: a slow reader
		// gets the newest, not a backlog.
		select {
		case <-c:
		default:
		}
		c <- snap
	}
}

// subscribe returns a channel of snapshots, starting with the latest.
func (s *lockServer) subscribe() (chan snapshot, func()) {
	c := make(chan snapshot, 1)
	s.mu.Lock()
	if s.hasLast {
		c <- s.last
	}
	s.subs[c] = struct{}{}
	s.mu.Unlock()
	return c, func() {
		s.mu.Lock()
		delete(s.subs, c)
		s.mu.Unlock()
	}
}

// events is the page's server-sent event stream: one "data:" line of JSON
// per snapshot. EventSource reconnects by itself after an error.
func (s *lockServer) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	c, unsubscribe := s.subscribe()
	defer unsubscribe()
	// Ask the browser to retry a lost stream after about one interval.
	fmt.Fprintf(w, "retry: %d\n\n", max(s.interval.Milliseconds(), 1000))
	if err := rc.Flush(); err != nil {
		return
	}
	for {
		select {
		case snap := <-c:
			b, err := json.Marshal(snap)
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-s.quit:
			return
		}
	}
}

// apiLocks answers with the latest snapshot.
func (s *lockServer) apiLocks(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	snap, ok := s.last, s.hasLast
	s.mu.Unlock()
	if !ok {
		s.refresh()
		s.mu.Lock()
		snap = s.last
		s.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(snap)
}

// servePage is the live page: one HTML file with its style and script
// inline.
//
//go:embed serve.html
var servePage []byte
