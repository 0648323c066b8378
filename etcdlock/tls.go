package etcdlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/internal/openurl"
)

// http2Preface opens an HTTP/2 (gRPC) conversation; a server answers it
// with a SETTINGS frame.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// probeTLS makes a TLS handshake with each endpoint in turn, sends the
// HTTP/2 preface and reads the first byte of the answer (under TLS 1.3 a
// server refuses a client certificate only then), within timeout. It
// returns nil at the first endpoint that answers, or times out after a
// complete handshake (which proves nothing wrong), and otherwise an error
// with every endpoint's reason: the x509 or handshake error that gRPC would
// hide behind "context deadline exceeded".
func probeTLS(ctx context.Context, endpoints []string, tc *tls.Config, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg := tc.Clone()
	cfg.NextProtos = []string{"h2"}
	var reasons []string
	for _, ep := range endpoints {
		err := probeOne(ctx, ep, cfg)
		if err == nil {
			return nil
		}
		reasons = append(reasons, ep+": "+err.Error())
	}
	return fmt.Errorf("TLS handshake: %s", strings.Join(reasons, "; "))
}

func probeOne(ctx context.Context, endpoint string, cfg *tls.Config) error {
	d := &tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", endpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte(http2Preface)); err != nil {
		return err
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // the handshake went through; let gRPC find the rest
		}
		return err
	}
	return nil
}

// connectError is the error of an Open that could not reach the cluster,
// without u's secrets; when plaintext was used against a member that speaks
// TLS, it says so.
func connectError(ctx context.Context, cfg clientv3.Config, u *url.URL, err error) error {
	if cfg.TLS == nil && speaksTLS(ctx, cfg.Endpoints) {
		err = fmt.Errorf("%w (the server speaks TLS: use etcds://, tls=true or ca_file)", err)
	}
	return fmt.Errorf("etcdlock: connect to %s: %w", strings.Join(cfg.Endpoints, ","), openurl.RedactError(err, u))
}

// speaksTLS reports whether some endpoint completes a TLS handshake within a
// second (unverified: it only explains a plaintext failure).
func speaksTLS(ctx context.Context, endpoints []string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}} //nolint:gosec // a probe, nothing is sent
	for _, ep := range endpoints {
		if c, err := d.DialContext(ctx, "tcp", ep); err == nil {
			c.Close()
			return true
		}
	}
	return false
}
