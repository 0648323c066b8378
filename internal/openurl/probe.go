package openurl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// ProbeTLS makes a TLS handshake with each endpoint ("host:port") in turn,
// within timeout, so that an opener can report why TLS fails (an x509
// reason, a refused client certificate, a server that does not speak TLS)
// where its client library would only time out. After the handshake it
// sends hello, when not empty, and, under TLS 1.3 (where a server refuses a
// client certificate only after the client's handshake is done), waits up
// to a quarter of a second for the first byte of an answer. It returns nil
// at the first endpoint that answers, or stays silent after a complete
// handshake, and otherwise an error with every endpoint's reason. cfg's
// ServerName, when empty, is each endpoint's host.
func ProbeTLS(ctx context.Context, endpoints []string, cfg *tls.Config, hello []byte, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var reasons []string
	for _, ep := range endpoints {
		err := probeOne(ctx, ep, cfg, hello)
		if err == nil {
			return nil
		}
		reasons = append(reasons, ep+": "+err.Error())
	}
	return fmt.Errorf("TLS handshake: %s", strings.Join(reasons, "; "))
}

func probeOne(ctx context.Context, endpoint string, cfg *tls.Config, hello []byte) error {
	d := &tls.Dialer{Config: cfg}
	nc, err := d.DialContext(ctx, "tcp", endpoint)
	if err != nil {
		return err
	}
	c := nc.(*tls.Conn)
	defer c.Close()
	if len(hello) > 0 {
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		if _, err := c.Write(hello); err != nil {
			return err
		}
	} else if c.ConnectionState().Version < tls.VersionTLS13 {
		return nil // the server has checked everything it will check
	}
	_ = c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // the handshake went through; let the client find the rest
		}
		return err
	}
	return nil
}

// SpeaksTLS reports whether some endpoint answers a TLS handshake within a
// second: completes it, or refuses it with a TLS alert (a server that wants
// a client certificate). It verifies nothing and sends nothing else: it
// only explains why a plaintext connection failed.
func SpeaksTLS(ctx context.Context, endpoints []string, nextProtos ...string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, NextProtos: nextProtos}} //nolint:gosec // a probe that sends no data
	for _, ep := range endpoints {
		c, err := d.DialContext(ctx, "tcp", ep)
		if err == nil {
			c.Close()
			return true
		}
		var oe *net.OpError // crypto/tls reports a peer's alert as a "remote error"
		if errors.As(err, &oe) && oe.Op == "remote error" {
			return true
		}
	}
	return false
}
