package zklock

import (
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/openurl/tlstest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestTLSAndAuth opens zk URLs against a ZooKeeper whose client port speaks
// only TLS and requires a client certificate signed by the test CA: the CA,
// the client certificate and the server name come from the URL (zks:// or
// tls=true or the file parameters); a wrong CA, a wrong server name, a
// missing client certificate and plaintext fail Open with their reason.
// Digest credentials make the nodes the creator's by default, and a wrong
// password fails Open (ZooKeeper itself accepts any digest password).
func TestTLSAndAuth(t *testing.T) {
	const pw = "s3cret-Pa55"
	ts := testserver.NewTLS(t)
	c := testserver.ZooKeeperWith(t, 1, &testserver.ZooKeeperOptions{TLS: ts, ClientAuth: true})
	addr := c.Members[0].Addr()
	plain := strings.Join(shared.Endpoints(), ",")
	files := ts.URLParams(ts.CAFile, true)
	alice := "zk://alice:" + pw + "@" + addr + "/tlslocks?connect_timeout=5s&" + files
	tlstest.Run(t, []tlstest.Case{
		// The first open creates /tlslocks with alice's creator ACL.
		{Name: "verified mTLS with digest auth", URL: alice},
		{Name: "zks scheme and server_name", URL: "zks://alice:" + pw + "@" + addr + "/tlslocks?" + files + "&server_name=" + testserver.TLSServerName},
		{Name: "wrong password", URL: "zk://alice:wrong-" + pw + "@" + addr + "/tlslocks?" + files, WantErr: `user "alice" may not`, Secret: "wrong-" + pw},
		{Name: "another user", URL: "zk://bob:" + pw + "@" + addr + "/tlslocks?" + files, WantErr: `user "bob" may not`, Secret: pw},
		{Name: "wrong CA", URL: "zk://" + addr + "/?" + ts.URLParams(ts.OtherCAFile, true), WantErr: "x509: certificate signed by unknown authority"},
		{Name: "wrong server_name", URL: "zk://" + addr + "/?" + files + "&server_name=other.example", WantErr: "x509: certificate is valid for"},
		{Name: "no client certificate", URL: "zk://" + addr + "/?" + ts.URLParams(ts.CAFile, false), WantErr: "bad certificate|certificate required|handshake failure|EOF|connection reset"},
		{Name: "plaintext against TLS", URL: "zk://" + addr + "/?connect_timeout=2s", WantErr: "the server speaks TLS"},
		{Name: "TLS asked of a plaintext server", URL: "zk://" + plain + "/?connect_timeout=3s&" + ts.URLParams(ts.CAFile, false), WantErr: "TLS handshake: "},
	})
}
