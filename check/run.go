package check

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock/dlock/check/internal/proxy"
	"github.com/dlock/dlock/internal/openurl"
)

// Run runs a workload against a backend with the configured faults and
// returns everything that happened. It starts Config.Workers worker
// processes (Config.WorkerCommand), each with Config.Goroutines goroutines
// that lock one of Config.Locks names at random, write through a fenced
// resource embedded in the coordinator while they hold it, and unlock; it
// injects the faults one after another after a warm-up; when Duration has
// passed (or ctx ends) it stops the workers, which close their clients and
// report leaks, and stops any servers it started.
//
// Run returns an error only when the run could not be carried out (bad
// configuration, servers that would not start, workers that could not be
// started); what went wrong with the locks is in the History for Analyze.
// Bad configuration is reported before anything starts.
func Run(ctx context.Context, cfg Config) (*History, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, holding: map[holdKey]bool{}}
	return r.run(ctx)
}

// holdKey identifies one Lock attempt.
type holdKey struct {
	worker, goroutine int
	op                int64
}

// runner is one Run's coordinator.
type runner struct {
	cfg      Config
	servers  *Servers
	url      string // the URL most workers use
	proxyURL string // worker 0's URL through the proxies ("" without)
	proxies  []*proxy.Proxy
	res      *resource
	locks    []string
	cmd      []string

	mu       sync.Mutex
	events   []Event
	holding  map[holdKey]bool
	grants   int
	faults   int
	workers  []*workerProc
	stopping bool
	clockOff time.Duration
}

func (r *runner) record(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	k := holdKey{ev.Worker, ev.Goroutine, ev.Op}
	switch ev.Kind {
	case KindGrant:
		r.grants++
		r.holding[k] = true
	case KindUnlockStart, KindDone:
		delete(r.holding, k)
	case KindFaultStart:
		r.faults++
	}
}

// holders returns the workers holding a lock now, by index.
func (r *runner) holders() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for k := range r.holding {
		if !slices.Contains(out, k.worker) {
			out = append(out, k.worker)
		}
	}
	sort.Ints(out)
	return out
}

// forget drops the holds of a worker that was killed.
func (r *runner) forget(worker int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.holding {
		if k.worker == worker {
			delete(r.holding, k)
		}
	}
}

func (r *runner) run(ctx context.Context) (h *History, err error) {
	cfg := &r.cfg
	r.cmd = cfg.WorkerCommand
	if len(r.cmd) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("check: cannot find this program to start workers: %w", err)
		}
		r.cmd = []string{exe, "check-worker"}
	}
	switch {
	case cfg.Spawn != "" && cfg.Servers != nil:
		if cfg.Servers.Backend() != cfg.Spawn {
			return nil, fmt.Errorf("check: Servers serve %s, not %s", cfg.Servers.Backend(), cfg.Spawn)
		}
		r.servers = cfg.Servers
	case cfg.Spawn != "":
		r.servers, err = StartServers(cfg.Spawn, cfg.Faults, cfg.TTL)
		if err != nil {
			return nil, err
		}
		defer r.servers.Stop()
	}
	r.url = cfg.URL
	if r.servers != nil {
		r.url = r.servers.url
		defer r.servers.resetClock()
	}
	u, err := url.Parse(r.url)
	if err != nil {
		return nil, errors.New("check: the URL cannot be parsed")
	}
	if slices.Contains(cfg.Faults, FaultPartition) || slices.Contains(cfg.Faults, FaultLatency) {
		if err := r.startProxies(u); err != nil {
			return nil, err
		}
		defer r.closeProxies()
	}
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	for i := range cfg.Locks {
		r.locks = append(r.locks, fmt.Sprintf("dlock-check/%s/%d", hex.EncodeToString(id), i))
	}
	r.res, err = startResource(r.record)
	if err != nil {
		return nil, fmt.Errorf("check: fenced resource: %w", err)
	}
	defer r.res.close()

	h = &History{
		Backend: cfg.backendKind(), URL: openurl.RedactURL(u),
		TTL: cfg.TTL, LockDelay: cfg.LockDelay, Goroutines: cfg.Goroutines,
		Locks: r.locks, Faults: slices.Clone(cfg.Faults),
	}
	if h.Faults == nil {
		h.Faults = []string{}
	}
	for i := range cfg.Workers {
		if err := r.startWorker(i); err != nil {
			r.stopWorkers()
			return nil, err
		}
	}
	h.Start = mono()
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.injectFaults(runCtx)
	}()
	r.progress(runCtx)
	wg.Wait()
	r.stopWorkers()
	h.End = mono()

	r.mu.Lock()
	h.Workers = len(r.workers)
	h.Events = slices.Clone(r.events)
	r.mu.Unlock()
	sort.SliceStable(h.Events, func(i, j int) bool { return h.Events[i].Mono < h.Events[j].Mono })
	return h, nil
}

// progress reports once a second until ctx ends.
func (r *runner) progress(ctx context.Context) {
	start := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if r.cfg.Progress != nil {
				r.cfg.Progress("\r" + r.status(start) + " stopping workers…")
			}
			return
		case <-t.C:
			if r.cfg.Progress != nil {
				r.cfg.Progress("\r" + r.status(start))
			}
		}
	}
}

func (r *runner) status(start time.Time) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	el := time.Since(start).Truncate(time.Second)
	return fmt.Sprintf("check %s: %v/%v, %d grants, %d faults, %d writes", r.cfg.backendKind(), el, r.cfg.Duration, r.grants, r.faults, r.writesLocked())
}

func (r *runner) writesLocked() int {
	n := 0
	for i := range r.events {
		if r.events[i].Kind == KindWrite {
			n++
		}
	}
	return n
}

// startProxies puts one proxy in front of each server address for worker 0:
// the URL's hosts, or for a quorum: URL those of each node= URL.
func (r *runner) startProxies(u *url.URL) error {
	pu := *u
	if u.Scheme == "quorum" {
		q := u.Query()
		nodes := q["node"]
		for i, raw := range nodes {
			nu, err := url.Parse(raw)
			if err != nil {
				r.closeProxies()
				return badConfig{fmt.Errorf("check: node %d of the quorum URL does not parse", i+1)}
			}
			if nu.Host, err = r.proxyHosts(nu.Host); err != nil {
				return err
			}
			nodes[i] = nu.String()
		}
		pu.RawQuery = q.Encode()
	} else {
		var err error
		if pu.Host, err = r.proxyHosts(u.Host); err != nil {
			return err
		}
	}
	r.proxyURL = pu.String()
	return nil
}

// proxyHosts starts a proxy for each address of hosts (host:port, comma
// separated) and returns the proxies' addresses in their place. On an
// error it closes every proxy started so far.
func (r *runner) proxyHosts(hosts string) (string, error) {
	var addrs []string
	for _, h := range strings.Split(hosts, ",") {
		if !strings.Contains(h, ":") {
			r.closeProxies()
			return "", badConfig{fmt.Errorf("check: partition and latency need an explicit port on every host of the URL (got %q)", h)}
		}
		p, err := proxy.Start(h)
		if err != nil {
			r.closeProxies()
			return "", fmt.Errorf("check: proxy: %w", err)
		}
		r.proxies = append(r.proxies, p)
		addrs = append(addrs, p.Addr())
	}
	return strings.Join(addrs, ","), nil
}

func (r *runner) closeProxies() {
	for _, p := range r.proxies {
		p.Close()
	}
}

// workerProc is one worker process.
type workerProc struct {
	index  int
	cmd    *exec.Cmd
	stdin  interface{ Close() error }
	done   chan struct{} // closed when the process exited and its output was read
	killed bool          // killed by a fault (under runner.mu)
	stderr *tail
}

func (r *runner) startWorker(index int) error {
	wurl := r.url
	if index == 0 && r.proxyURL != "" {
		wurl = r.proxyURL
	}
	wc := workerConfig{URL: wurl, Index: index, Goroutines: r.cfg.Goroutines, Locks: r.locks,
		TTL: r.cfg.TTL, LockDelay: r.cfg.LockDelay, HoldMin: r.cfg.HoldMin, HoldMax: r.cfg.HoldMax,
		Resource: r.res.addr()}
	raw, err := json.Marshal(wc)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.cmd[0], r.cmd[1:]...)
	cmd.Env = append(os.Environ(), WorkerEnv+"="+string(raw))
	cmd.SysProcAttr = workerProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	w := &workerProc{index: index, cmd: cmd, stdin: stdin, done: make(chan struct{}), stderr: &tail{max: 8 << 10}}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("check: start worker %d (%s): %w", index, r.cmd[0], err)
	}
	r.mu.Lock()
	r.workers = append(r.workers, w)
	r.mu.Unlock()
	ready := make(chan struct{})
	var openErr string
	go func() {
		defer close(w.done)
		isReady := false
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var ev Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				continue // a stray line from a library: not an event
			}
			if !isReady {
				switch {
				case ev.Kind == kindReady:
					isReady = true
					close(ready)
					continue
				case ev.Kind == KindPanic:
					openErr = ev.Err // the worker could not start
					continue
				}
			}
			ev.Worker = index
			r.record(ev)
		}
		err := cmd.Wait()
		if !isReady {
			return // startWorker reports it
		}
		r.mu.Lock()
		expected := w.killed || (r.stopping && err == nil)
		r.mu.Unlock()
		if err != nil && !expected {
			ev := stamp(KindPanic)
			ev.Worker, ev.Goroutine = index, -1
			ev.Err = fmt.Sprintf("worker exited abnormally (%v): %s", err, w.stderr.String())
			r.record(ev)
		}
	}()
	timer := time.NewTimer(workerStartTimeout)
	defer timer.Stop()
	select {
	case <-ready:
		return nil
	case <-w.done:
		if openErr == "" {
			openErr = w.stderr.String()
		}
	case <-timer.C:
		r.mu.Lock()
		w.killed = true
		r.mu.Unlock()
		_ = cmd.Process.Kill()
		<-w.done
		openErr = fmt.Sprintf("not ready within %v", workerStartTimeout)
	}
	r.mu.Lock()
	r.workers = slices.DeleteFunc(r.workers, func(x *workerProc) bool { return x == w })
	r.mu.Unlock()
	return fmt.Errorf("check: worker %d could not start: %s", index, openErr)
}

// workerStartTimeout bounds a worker's start (process start and Open).
const workerStartTimeout = time.Minute

// stopWorkers closes every worker's stdin, waits for them to stop, and
// kills any that hang.
func (r *runner) stopWorkers() {
	r.mu.Lock()
	r.stopping = true
	ws := slices.Clone(r.workers)
	r.mu.Unlock()
	for _, w := range ws {
		_ = w.cmd.Process.Signal(syscall.SIGCONT) // in case a fault left it stopped
		w.stdin.Close()
	}
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for _, w := range ws {
		select {
		case <-w.done:
		case <-deadline.C:
		}
		select {
		case <-w.done:
		default:
			ev := stamp(KindPanic)
			ev.Worker, ev.Goroutine = w.index, -1
			ev.Err = "worker did not stop within 30s of being asked (a hung Lock, Unlock or Close)"
			r.record(ev)
			r.mu.Lock()
			w.killed = true
			r.mu.Unlock()
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	}
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
