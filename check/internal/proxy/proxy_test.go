package proxy

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	_ = c.SetDeadline(start.Add(limit))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := r.ReadString('\n')
	if err == nil && line != "ping\n" {
		t.Fatalf("echo returned %q", line)
	}
	return time.Since(start), err
}

func TestProxyForwardsDelaysAndPartitions(t *testing.T) {
	p, err := Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(t, c, r, 5*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	p.SetDelay(100 * time.Millisecond)
	d, err := roundTrip(t, c, r, 5*time.Second)
	if err != nil {
		t.Fatalf("with latency: %v", err)
	}
	if d < 200*time.Millisecond {
		t.Errorf("round trip with 100ms each way took %v, want ≥ 200ms", d)
	}
	p.SetDelay(0)

	p.Partition()
	if _, err := roundTrip(t, c, r, 300*time.Millisecond); err == nil {
		t.Fatal("a round trip went through a partition")
	}
	// A new connection during the partition goes nowhere either.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := roundTrip(t, c2, bufio.NewReader(c2), 300*time.Millisecond); err == nil {
		t.Fatal("a connection made during the partition reached the server")
	}
	p.Heal()
	// Connections that lived through the partition are closed; new ones work.
	if _, err := roundTrip(t, c, r, 5*time.Second); err == nil {
		t.Error("a connection that lived through the partition still works after Heal; want it closed")
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := roundTrip(t, c3, bufio.NewReader(c3), 5*time.Second); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
}
