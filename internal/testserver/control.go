package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// defaultStopGrace is how long Stop waits after the polite signal before
// SIGKILL. The data is thrown away, so there is no point in waiting long;
// PostgreSQL gets more (its fast shutdown releases its System V shared
// memory, which SIGKILL would leak).
const defaultStopGrace = time.Second

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
