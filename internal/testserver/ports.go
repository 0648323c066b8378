package testserver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
)

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
