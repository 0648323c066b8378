package redislock

import (
	"net/url"
	"testing"

	"github.com/dlock/dlock/internal/openurl/tlstest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestTLSAndAuth opens URLs against a redis-server that speaks only TLS,
// requires a client certificate signed by the test CA and a password: the
// CA, the client certificate and the server name come from the URL; a wrong
// password, a wrong CA, a missing client certificate and plaintext each fail
// Open with their reason and without the password in the error. (A
// plaintext Redis never answers a TLS hello, so that case fails by timeout:
// what matters is that it fails instead of falling back to plaintext.)
func TestTLSAndAuth(t *testing.T) {
	const pw = "s3cret-Pa55"
	ts := testserver.NewTLS(t)
	srv := testserver.Redis(t, &testserver.RedisOptions{TLS: ts, ClientAuth: true, Password: pw})
	plain := testserver.Redis(t, &testserver.RedisOptions{Password: pw})
	files := ts.URLParams(ts.CAFile, true)
	base := "rediss://:" + pw + "@" + srv.Addr() + "/0?"
	tlstest.Run(t, []tlstest.Case{
		{Name: "verified mTLS with password", URL: base + files},
		{Name: "tls=true on redis scheme", URL: "redis://:" + pw + "@" + srv.Addr() + "/0?tls=true&" + files},
		{Name: "files alone imply TLS", URL: "redis://:" + pw + "@" + srv.Addr() + "/0?" + files},
		{Name: "server_name", URL: base + files + "&server_name=" + testserver.TLSServerName},
		{Name: "wrong server_name", URL: base + files + "&server_name=other.example", WantErr: "x509: certificate is valid for", Secret: pw},
		{Name: "wrong password", URL: "rediss://:wrong-" + pw + "@" + srv.Addr() + "/0?" + files, WantErr: "WRONGPASS|invalid password", Secret: "wrong-" + pw},
		{Name: "no password", URL: "rediss://" + srv.Addr() + "/0?" + files, WantErr: "NOAUTH"},
		{Name: "wrong CA", URL: base + ts.URLParams(ts.OtherCAFile, true), WantErr: "x509: certificate signed by unknown authority", Secret: pw},
		{Name: "no client certificate", URL: base + ts.URLParams(ts.CAFile, false), WantErr: "certificate required|connection reset|EOF|broken pipe", Secret: pw},
		{Name: "TLS asked of a plaintext server", URL: "redis://:" + pw + "@" + plain.Addr() + "/0?dial_timeout=1s&" + ts.URLParams(ts.CAFile, false), WantErr: "tls:|EOF|connection reset|deadline exceeded|i/o timeout", Secret: pw},
		{Name: "missing ca_file", URL: base + "ca_file=/nonexistent/ca.pem", WantErr: "ca_file: open /nonexistent/ca.pem"},
		{Name: "cert_file without key_file", URL: base + "cert_file=" + url.QueryEscape(ts.ClientCertFile), WantErr: "cert_file and key_file must be given together"},
	})
}
