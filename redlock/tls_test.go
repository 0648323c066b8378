package redlock

import (
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/openurl/tlstest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestTLSAndAuth opens redlock URLs against three redis-servers that speak
// only TLS, require a client certificate signed by the test CA and a
// password: tls=true (or any TLS file parameter) with the CA, the client
// certificate and the server name from the URL works on every node; a wrong
// password, a wrong CA and a missing client certificate fail Open with their
// reason and without the password in the error.
func TestTLSAndAuth(t *testing.T) {
	const pw = "s3cret-Pa55"
	ts := testserver.NewTLS(t)
	srvs := testserver.RedisN(t, 3, &testserver.RedisOptions{TLS: ts, ClientAuth: true, Password: pw})
	hosts := make([]string, len(srvs))
	for i, s := range srvs {
		hosts[i] = s.Addr()
	}
	nodes := strings.Join(hosts, ",")
	files := ts.URLParams(ts.CAFile, true)
	base := "redlock://:" + pw + "@" + nodes + "/0?"
	tlstest.Run(t, []tlstest.Case{
		{Name: "tls=true verified mTLS with password", URL: base + "tls=true&" + files},
		{Name: "files alone imply TLS", URL: base + files + "&server_name=" + testserver.TLSServerName},
		{Name: "wrong password", URL: "redlock://:wrong-" + pw + "@" + nodes + "/0?" + files, WantErr: "WRONGPASS", Secret: "wrong-" + pw},
		{Name: "wrong CA", URL: base + ts.URLParams(ts.OtherCAFile, true), WantErr: "x509: certificate signed by unknown authority", Secret: pw},
		{Name: "no client certificate", URL: base + ts.URLParams(ts.CAFile, false), WantErr: "certificate required|connection reset|EOF|broken pipe", Secret: pw},
		{Name: "plaintext against TLS", URL: base + "node_timeout=1s&dial_timeout=1s", WantErr: "only 0 of 3 nodes reachable", Secret: pw},
		{Name: "tls=false with files", URL: base + "tls=false&" + files, WantErr: "tls=false contradicts"},
	})
}
