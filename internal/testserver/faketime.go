package testserver

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// libfaketimePaths are where Debian's faketime package puts the library. The
// MT build is the one for multi-threaded programs (MariaDB, the JVM, Redis's
// background threads).
var libfaketimePaths = []string{
	"/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
	"/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
	"/usr/lib/faketime/libfaketimeMT.so.1",
	"/usr/local/lib/faketime/libfaketimeMT.so.1",
}

// libfaketime returns the path of libfaketimeMT.so.1 or an error wrapping
// ErrNotInstalled.
func libfaketime() (string, error) {
	for _, p := range libfaketimePaths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: libfaketime (Debian package faketime)", ErrNotInstalled)
}

// setupFaketime prepares s to run under libfaketime with a zero offset. It
// must be called before the first start.
func (s *Server) setupFaketime() error {
	if _, err := libfaketime(); err != nil {
		return err
	}
	s.faketime = filepath.Join(s.dir, "faketime")
	return writeOffset(s.faketime, 0, s.cred)
}

// faketimeEnv is the environment that puts a process under libfaketime,
// reading its offset from file on every clock call. Only the wall clock is
// faked (FAKETIME_DONT_FAKE_MONOTONIC): what an NTP step or an operator's
// mistake moves is CLOCK_REALTIME, and servers that time sessions on the
// monotonic clock (ZooKeeper) must be seen to ignore such jumps.
//
// FAKETIME_FORCE_MONOTONIC_FIX=0 matters for the JVM: with libfaketime 0.9.10
// and an unfaked monotonic clock, its pthread_cond_timedwait workaround makes
// the JVM's timed waits spin (half a core while idle, ten times slower start).
//
// extraPreload names libraries to preload after libfaketime. Redis needs
// "libc.so.6" there: Debian's redis-server is linked with jemalloc, whose
// first malloc reads the clock while libfaketime is still initialising (and
// libfaketime gives up); preloading libc puts glibc's malloc ahead of
// jemalloc's, and Redis runs on it unchanged.
func faketimeEnv(file string, extraPreload ...string) []string {
	lib, _ := libfaketime()
	return []string{
		"LD_PRELOAD=" + strings.Join(append([]string{lib}, extraPreload...), " "),
		"FAKETIME_TIMESTAMP_FILE=" + file,
		"FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
		"FAKETIME_FORCE_MONOTONIC_FIX=0",
	}
}

// writeOffset replaces the timestamp file atomically with a relative offset
// such as "+5.000000" (seconds), the form libfaketime reads.
func writeOffset(file string, d time.Duration, cred *syscall.Credential) error {
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%+.6f\n", d.Seconds())), 0o644); err != nil {
		return fmt.Errorf("testserver: write faketime offset: %w", err)
	}
	if cred != nil {
		if err := os.Chown(tmp, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("testserver: write faketime offset: %w", err)
		}
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("testserver: write faketime offset: %w", err)
	}
	return nil
}
