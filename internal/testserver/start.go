package testserver

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// startTimeout bounds how long a start or restart may take before it counts as
// failed. ZooKeeper ensembles and MariaDB are the slow ones on a loaded 2-core
// machine.
const startTimeout = 90 * time.Second

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
