package check

import (
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSettleLeaks: the worker's leak check reports goroutines and sockets
// left over after the baseline, and nothing once they are gone.
func TestSettleLeaks(t *testing.T) {
	baseG, baseS := runtime.NumGoroutine(), countSockets()
	if baseS < 0 {
		t.Skip("no /proc/self/fd on this system")
	}
	// Many goroutines, so that goroutines of earlier tests still winding
	// down (counted in the baseline) cannot hide the leak.
	const leaked = 50
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range leaked {
		wg.Add(1)
		go func() { defer wg.Done(); <-stop }()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	msg := settleLeaks(baseG, baseS, 100*time.Millisecond)
	if !strings.Contains(msg, "goroutines left") || !strings.Contains(msg, "sockets open") {
		t.Errorf("settleLeaks with a goroutine and a socket left = %q", msg)
	}
	close(stop)
	wg.Wait()
	ln.Close()
	if msg := settleLeaks(baseG, baseS, 5*time.Second); msg != "" {
		t.Errorf("settleLeaks after cleaning up = %q, want nothing", msg)
	}
}
