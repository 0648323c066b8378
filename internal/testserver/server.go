package testserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ErrExternal is returned by a fault control (Kill, Restart, Pause, Resume,
// SetClockOffset) on a server that this package did not start: one named by a
// DLOCK_TEST_*_URL environment variable. When the Server belongs to a test
// (it came from Redis, Etcd, ZooKeeper, Postgres or MariaDB), the control
// skips that test instead.
var ErrExternal = errors.New("testserver: fault control on an external server (set by a DLOCK_TEST_*_URL variable)")

// ErrNotInstalled is returned (wrapped, naming the missing program) when a
// server's program is not on this machine. The functions taking a testing.TB
// skip the test instead; `make test` installs everything, and with CI=true a
// skipped backend test fails the run.
var ErrNotInstalled = errors.New("testserver: server program not installed (run `make test`, or scripts/install-deps.sh)")

// ErrNoFaketime is returned by SetClockOffset on a server that was not started
// with Faketime set.
var ErrNoFaketime = errors.New("testserver: server was not started under libfaketime")

// startTimeout bounds how long a start or restart may take before it counts as
// failed. ZooKeeper ensembles and MariaDB are the slow ones on a loaded 2-core
// machine.
const startTimeout = 90 * time.Second

// defaultStopGrace is how long Stop waits after the polite signal before
// SIGKILL. The data is thrown away, so there is no point in waiting long;
// PostgreSQL gets more (its fast shutdown releases its System V shared
// memory, which SIGKILL would leak).
const defaultStopGrace = time.Second

// Server is one server process started by this package, or an external
// server named by an environment variable. All methods are safe for
// concurrent use. Fault controls act on the server's whole process tree, so
// servers that fork (PostgreSQL backends) are killed, paused and resumed as a
// unit.
type Server struct {
	kind string
	tb   testing.TB // set by the testing.TB constructors; used to skip on external servers

	external bool
	addr     string
	url      string
	dsn      string

	// Set by the kind-specific constructor; immutable after start.
	dir      string                          // temporary directory, removed by Stop
	port     int                             // client port, kept across restarts
	dataDir  string                          // removed by Restart(true)
	initData func() error                    // creates dataDir's contents from nothing
	wiped    func() error                    // optional, run after a wipe's initData (etcd rejoins its cluster)
	command  func() *exec.Cmd                // builds the server command line
	ready    func(ctx context.Context) error // one real request; nil error means it answers
	after    func(ctx context.Context) error // optional, run once it answers (create databases)
	cleanup  func()                          // optional, frees what a dead server left outside dir (before a wipe, at Stop)
	stopSig  syscall.Signal                  // polite stop signal (default SIGTERM)
	stopWait time.Duration                   // grace before SIGKILL (default defaultStopGrace)
	cred     *syscall.Credential             // run as this user when set
	faketime string                          // timestamp file, "" without faketime
	preload  []string                        // preloaded after libfaketime (see faketimeEnv)
	logPath  string

	mu      sync.Mutex
	proc    *process
	stopped bool
	alive   atomic.Bool // proc != nil; read without mu so members can ask each other
}

type process struct {
	cmd  *exec.Cmd
	pgid int
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result, valid after done
}

// Addr returns the server's client address, "127.0.0.1:port".
func (s *Server) Addr() string { return s.addr }

// URL returns the address in the form the kind's dlock driver and client
// library take (see the package documentation).
func (s *Server) URL() string { return s.url }

// DSN returns the go-sql-driver/mysql data source name for a MariaDB server,
// "root@tcp(127.0.0.1:port)/dlock?parseTime=true"; "" for other kinds.
func (s *Server) DSN() string { return s.dsn }

// External reports whether the server was named by a DLOCK_TEST_*_URL
// variable rather than started by this package. Fault controls do not work on
// external servers.
func (s *Server) External() bool { return s.external }

// Dir returns the server's temporary directory ("" for external servers). Its
// log is server.log there.
func (s *Server) Dir() string { return s.dir }

// Running reports whether the server process is alive (stopped by Pause
// counts as alive). External servers always report true.
func (s *Server) Running() bool {
	if s.external {
		return true
	}
	return s.alive.Load()
}

// faultControl refuses fault controls on external servers: it skips s's test
// when there is one, and otherwise returns ErrExternal.
func (s *Server) faultControl(what string) error {
	if !s.external {
		return nil
	}
	if s.tb != nil {
		s.tb.Helper()
		s.tb.Skipf("testserver: %s %s: the server is external (set by an environment variable); fault controls need a server started by the test", what, s.kind)
	}
	return fmt.Errorf("%s %s: %w", what, s.kind, ErrExternal)
}

// Kill sends SIGKILL to the server and every process it started, and waits
// until all have exited, as a crash of the machine would. Killing a server
// that is not running does nothing.
func (s *Server) Kill() error {
	if err := s.faultControl("Kill"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killLocked()
}

func (s *Server) killLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	s.alive.Store(false)
	pids := signalTree(p.pgid, syscall.SIGKILL)
	<-p.done
	return waitGone(pids, 10*time.Second)
}

// Restart starts the server again on the same port and waits until it
// answers. If it is running, Restart first kills it (SIGKILL). With wipe, the
// server's data is deleted first, so it comes back empty; without, it keeps
// whatever it had made durable (for Redis without AppendOnly: nothing).
func (s *Server) Restart(wipe bool) error {
	if err := s.faultControl("Restart"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("testserver: Restart %s: the server was stopped", s.kind)
	}
	if err := s.killLocked(); err != nil {
		return err
	}
	if wipe {
		if s.cleanup != nil {
			s.cleanup()
		}
		if err := os.RemoveAll(s.dataDir); err != nil {
			return fmt.Errorf("testserver: Restart %s: wipe: %w", s.kind, err)
		}
		if err := s.initData(); err != nil {
			return fmt.Errorf("testserver: Restart %s: %w", s.kind, err)
		}
		if s.wiped != nil {
			if err := s.wiped(); err != nil {
				return fmt.Errorf("testserver: Restart %s: %w", s.kind, err)
			}
		}
	}
	return s.restartLocked()
}

// restartLocked starts the server on its old port. Another process may have
// taken the port meanwhile (any outgoing connection can get it as its local
// port); then it waits for the port to come free and tries again.
func (s *Server) restartLocked() error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := s.startLocked()
		if err == nil || !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			return err
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_ = poll(ctx, nil, func(context.Context) error {
			l, err := net.Listen("tcp", s.addr)
			if err != nil {
				return err
			}
			return l.Close()
		})
		cancel()
	}
}

// Pause stops the server and every process it started with SIGSTOP:
// connections stay open but nothing is answered until Resume.
func (s *Server) Pause() error { return s.signal("Pause", syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error { return s.signal("Resume", syscall.SIGCONT) }

func (s *Server) signal(what string, sig syscall.Signal) error {
	if err := s.faultControl(what); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("testserver: %s %s: the server is not running", what, s.kind)
	}
	signalTree(s.proc.pgid, sig)
	return nil
}

// SetClockOffset moves the server's wall clock to real time plus d, at once
// and while it runs, by rewriting libfaketime's timestamp file. Only servers
// started with Faketime set have a fake clock; others return ErrNoFaketime.
// The monotonic clock is not faked, so timeouts measured on it are unaffected.
// The new offset is in effect when SetClockOffset returns.
func (s *Server) SetClockOffset(d time.Duration) error {
	if err := s.faultControl("SetClockOffset"); err != nil {
		return err
	}
	if s.faketime == "" {
		return fmt.Errorf("testserver: SetClockOffset %s: %w", s.kind, ErrNoFaketime)
	}
	return writeOffset(s.faketime, d, s.cred)
}

// Stop stops the server politely (SIGTERM, or SIGINT for PostgreSQL's fast
// shutdown), kills it if it has not exited within a second (PostgreSQL: five),
// and removes its temporary directory (kept when DLOCK_TEST_KEEP=1, for
// reading its server.log). Stop is idempotent; it does nothing for external
// servers. After Stop, Restart, Pause, Resume and SetClockOffset fail and Kill
// does nothing.
func (s *Server) Stop() {
	if s.external {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	if p := s.proc; p != nil {
		s.proc = nil
		s.alive.Store(false)
		sig := s.stopSig
		if sig == 0 {
			sig = syscall.SIGTERM
		}
		signalTree(p.pgid, syscall.SIGCONT)
		_ = syscall.Kill(p.cmd.Process.Pid, sig)
		grace := s.stopWait
		if grace == 0 {
			grace = defaultStopGrace
		}
		t := time.NewTimer(grace)
		select {
		case <-p.done:
		case <-t.C:
		}
		t.Stop()
		pids := signalTree(p.pgid, syscall.SIGKILL)
		<-p.done
		_ = waitGone(pids, 5*time.Second)
	}
	if s.cleanup != nil {
		s.cleanup()
	}
	if s.dir != "" && os.Getenv("DLOCK_TEST_KEEP") != "1" {
		_ = os.RemoveAll(s.dir)
	}
}

// startLocked starts the process and waits until ready answers. It must be
// called with s.mu held and no process running.
func (s *Server) startLocked() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("testserver: start %s: %w", s.kind, err)
	}
	logStart, _ := logf.Seek(0, io.SeekEnd)
	fmt.Fprintf(logf, "\n==== testserver: starting %s at %s ====\n", s.kind, time.Now().Format(time.RFC3339Nano))
	cmd := s.command()
	cmd.Stdout = logf
	cmd.Stderr = logf
	if cmd.Dir == "" {
		cmd.Dir = s.dir
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	if s.faketime != "" {
		cmd.Env = append(cmd.Env, faketimeEnv(s.faketime, s.preload...)...)
	}
	cmd.SysProcAttr = sysProcAttr(s.cred)
	err = cmd.Start()
	logf.Close() // the child has its own copy
	if err != nil {
		return fmt.Errorf("testserver: start %s: %w", s.kind, err)
	}
	p := &process{cmd: cmd, pgid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	s.alive.Store(true)

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.waitReady(ctx, p); err != nil {
		_ = s.killLocked()
		if s.portClash(logStart) {
			err = fmt.Errorf("%w (%v)", errPortInUse, err)
		}
		return fmt.Errorf("testserver: start %s on %s: %w\n%s", s.kind, s.addr, err, s.logTail())
	}
	if s.after != nil {
		if err := s.after(ctx); err != nil {
			_ = s.killLocked()
			return fmt.Errorf("testserver: start %s on %s: %w\n%s", s.kind, s.addr, err, s.logTail())
		}
	}
	return nil
}

// errPortInUse marks a start that failed because the port was taken.
var errPortInUse = errors.New("port already in use")

// portClash reports whether the log written since offset says the server
// could not bind its port.
func (s *Server) portClash(offset int64) bool {
	f, err := os.Open(s.logPath)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	l := strings.ToLower(string(b))
	return strings.Contains(l, "address already in use") || strings.Contains(l, "address in use")
}

// retryPorts runs a first start up to three times while it fails because a
// port that was free a moment ago got taken (by another test binary, or by an
// outgoing connection's local port); each try picks new ports.
func retryPorts[T any](start func() (T, error)) (T, error) {
	for i := 0; ; i++ {
		v, err := start()
		if err == nil || !errors.Is(err, errPortInUse) || i == 2 {
			return v, err
		}
	}
}

// waitReady polls s.ready until it succeeds, the process exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context, p *process) error {
	return poll(ctx, p.done, func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return s.ready(rctx)
	})
}

// poll calls check every few milliseconds until it returns nil, exited is
// closed (the server died), or ctx ends. The error names the last failure.
func poll(ctx context.Context, exited <-chan struct{}, check func(context.Context) error) error {
	delay := 10 * time.Millisecond
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-exited:
			t.Stop()
			return fmt.Errorf("server exited before it answered (last check: %v)", err)
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("server did not answer in time (last check: %v)", err)
		case <-t.C:
		}
		if delay < 100*time.Millisecond {
			delay += delay / 2
		}
	}
}

// logTail returns the end of the server's log, for start errors.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return "---- " + s.logPath + " (tail) ----\n" + string(b)
}

// signalTree sends sig to process pid, to its process group and to every
// descendant, and returns the pids it signalled. Descendants matter because
// some servers move their children into groups of their own (PostgreSQL
// backends call setsid). For SIGKILL and SIGSTOP the leader is stopped first,
// so it cannot fork while its children are collected.
func signalTree(pid int, sig syscall.Signal) []int {
	if sig == syscall.SIGKILL || sig == syscall.SIGSTOP {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	pids := append([]int{pid}, descendants(pid)...)
	_ = syscall.Kill(-pid, sig)
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
	return pids
}

// procStat is the part of /proc/<pid>/stat this file needs.
type procStat struct {
	pid, ppid int
	state     byte
}

func readProcs() []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || len(f[0]) == 0 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, procStat{pid: pid, ppid: ppid, state: f[0][0]})
	}
	return out
}

// descendants returns the pids of every live descendant of pid.
func descendants(pid int) []int {
	children := map[int][]int{}
	for _, p := range readProcs() {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// waitGone waits until none of pids is a live (non-zombie) process, so that
// ports and shared memory are released before a restart.
func waitGone(pids []int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		alive := 0
		for _, p := range pids {
			if processAlive(p) {
				alive++
			}
		}
		if alive == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: %d server processes still alive after SIGKILL", alive)
		}
		time.Sleep(10 * time.Millisecond) // polling the kernel's process table; there is nothing to wait on
	}
}

func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil && !os.IsNotExist(err)
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st != 'Z' && st != 'X'
}

// ---- shared helpers for the kinds ----

var (
	portMu   sync.Mutex
	usedPort = map[int]bool{}
)

// freePort returns a loopback TCP port that was free a moment ago and that
// this process has not handed out before.
func freePort() (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("testserver: find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !usedPort[port] {
			usedPort[port] = true
			return port, nil
		}
	}
	return 0, errors.New("testserver: find a free port: no new port after 50 tries")
}

// baseDir is where temporary directories go: $DLOCK_TEST_TMPDIR, else
// /dev/shm when it is a roomy tmpfs (fsync is free there, which matters for
// etcd and ZooKeeper), else the system temporary directory.
func baseDir() string {
	if d := os.Getenv("DLOCK_TEST_TMPDIR"); d != "" {
		return d
	}
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && st.Bavail*uint64(st.Bsize) > 2<<30 {
		if f, err := os.CreateTemp("/dev/shm", "dlock-probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}

// newServer creates the temporary directory and the parts every kind shares.
func newServer(kind string) (*Server, error) {
	dir, err := os.MkdirTemp(baseDir(), "dlock-"+kind+"-")
	if err != nil {
		return nil, fmt.Errorf("testserver: %s: %w", kind, err)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Server{
		kind:    kind,
		dir:     dir,
		port:    port,
		addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "server.log"),
	}, nil
}

// launch creates the data and starts a new server; on failure it removes
// everything.
func (s *Server) launch() error {
	if err := s.initData(); err != nil {
		os.RemoveAll(s.dir)
		return fmt.Errorf("testserver: %s: %w", s.kind, err)
	}
	s.mu.Lock()
	err := s.startLocked()
	s.mu.Unlock()
	if err != nil {
		os.RemoveAll(s.dir)
	}
	return err
}

// lookPath finds a program in PATH or in the given fallback locations, which
// matter when PATH lacks /usr/sbin.
func lookPath(name string, fallbacks ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, f := range fallbacks {
		if st, err := os.Stat(f); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrNotInstalled, name)
}

// external builds a Server for an address taken from an environment variable.
func externalServer(kind, rawURL string) (*Server, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("testserver: %s: the URL in the environment does not parse", kind)
	}
	host := u.Host
	if host == "" {
		return nil, fmt.Errorf("testserver: %s: the URL in the environment has no host", kind)
	}
	return &Server{kind: kind, external: true, addr: host, url: rawURL}, nil
}

// forTest turns a Start* result into the testing.TB form: a missing program
// skips the test, any other error fails it, and the server stops at cleanup.
func forTest(t testing.TB, s *Server, err error) *Server {
	t.Helper()
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	s.tb = t
	t.Cleanup(s.Stop)
	return s
}

// chown gives the tree under dir to cred's user (for servers that refuse to
// run as root).
func chown(dir string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(cred.Uid), int(cred.Gid))
	})
}

// run runs a helper program (initdb, mariadb-install-db) to completion with
// its output going to the server log, and returns an error carrying the log's
// tail when it fails.
func (s *Server) run(cmd *exec.Cmd) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n==== testserver: %s ====\n", strings.Join(cmd.Args, " "))
	cmd.Stdout = logf
	cmd.Stderr = logf
	if cmd.Dir == "" {
		cmd.Dir = s.dir
	}
	cmd.SysProcAttr = sysProcAttr(s.cred)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w\n%s", filepath.Base(cmd.Path), err, s.logTail())
	}
	return nil
}
