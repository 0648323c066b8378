package etcdlock

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/internal/openurl"
)

// http2Preface opens an HTTP/2 (gRPC) conversation; a server answers it
// with a SETTINGS frame.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// probeTLS makes a TLS handshake with the endpoints (openurl.ProbeTLS, with
// gRPC's ALPN and the HTTP/2 preface), so that a wrong CA, a wrong server
// name or a refused client certificate fails Open with its reason instead
// of gRPC's "context deadline exceeded".
func probeTLS(ctx context.Context, endpoints []string, tc *tls.Config, timeout time.Duration) error {
	cfg := tc.Clone()
	cfg.NextProtos = []string{"h2"}
	return openurl.ProbeTLS(ctx, endpoints, cfg, []byte(http2Preface), timeout)
}

// connectError is the error of an Open that could not reach the cluster,
// without u's secrets; when plaintext was used against a member that speaks
// TLS, it says so.
func connectError(ctx context.Context, cfg clientv3.Config, u *url.URL, err error) error {
	if cfg.TLS == nil && openurl.SpeaksTLS(ctx, cfg.Endpoints, "h2") {
		err = fmt.Errorf("%w (the server speaks TLS: use etcds://, tls=true or ca_file)", err)
	}
	return fmt.Errorf("etcdlock: connect to %s: %w", strings.Join(cfg.Endpoints, ","), openurl.RedactError(err, u))
}

// parseEndpoints reads the endpoints parameter, a comma-separated list as
// etcdctl's --endpoints takes it (https://h:2379, http://h:2379 or h:2379),
// into host:port endpoints, reporting whether they ask for TLS (https). A
// list that mixes https with plaintext is refused: it would send the
// credentials in the clear to some members.
func parseEndpoints(list string) (eps []string, https bool, err error) {
	var plain bool
	for _, e := range strings.Split(list, ",") {
		host := e
		if scheme, rest, ok := strings.Cut(e, "://"); ok {
			switch scheme {
			case "https":
				https = true
			case "http":
				plain = true
			default:
				return nil, false, openurl.BadURL("etcdlock: url parameter endpoints: %q: want http:// or https://", e)
			}
			host = strings.TrimSuffix(rest, "/")
		} else {
			plain = true
		}
		if host == "" || strings.ContainsAny(host, "/?#@") {
			return nil, false, openurl.BadURL("etcdlock: url parameter endpoints: %q is not an endpoint (want https://host:2379)", e)
		}
		if !strings.Contains(host, ":") {
			host += ":2379"
		}
		eps = append(eps, host)
	}
	if https && plain {
		return nil, false, openurl.BadURL("etcdlock: url parameter endpoints mixes https:// with plaintext endpoints")
	}
	return eps, https, nil
}
