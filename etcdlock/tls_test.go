package etcdlock

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock/dlock/internal/openurl/tlstest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestTLSAndAuth opens etcd URLs against a member that serves clients over
// TLS only, requires a client certificate signed by the test CA and has
// user/password auth on: the CA, the client certificate and the server name
// come from the URL (etcds:// or tls=true or the file parameters); a wrong
// password, a wrong CA, a wrong server name, a missing client certificate
// and plaintext each fail Open with their reason (old code: "context
// deadline exceeded" after dial_timeout) and without the password.
func TestTLSAndAuth(t *testing.T) {
	const pw = "s3cret-Pa55"
	// The member's certificate names only testserver.TLSServerName, not
	// the address dialled: only a client that honours server_name verifies
	// it (old code: gRPC verified the address whatever server_name said).
	ts, err := testserver.NewTLS(t).NameOnly()
	if err != nil {
		t.Fatal(err)
	}
	c := testserver.EtcdWith(t, 1, &testserver.EtcdOptions{TLS: ts, ClientAuth: true})
	addr := c.Members[0].Addr()
	plain := shared.Members[0].Addr()
	enableAuth(t, addr, ts, pw)
	files := "server_name=" + testserver.TLSServerName + "&" + ts.URLParams(ts.CAFile, true)
	base := "etcd://root:" + pw + "@" + addr + "/tlstest/?dial_timeout=3s&"
	tlstest.Run(t, []tlstest.Case{
		{Name: "verified mTLS with password", URL: base + files},
		{Name: "etcdctl-style https endpoints", URL: "etcd://root:" + pw + "@/tlstest/?endpoints=https://" + addr + "&" + files},
		{Name: "etcds scheme", URL: "etcds://root:" + pw + "@" + addr + "/tlstest/?" + files},
		{Name: "address without server_name", URL: base + ts.URLParams(ts.CAFile, true), WantErr: "x509: certificate is valid for " + testserver.TLSServerName + ", not 127.0.0.1|doesn't contain any IP SANs", Secret: pw},
		{Name: "wrong server_name", URL: base + files + "&server_name=other.example", WantErr: "x509: certificate is valid for", Secret: pw},
		{Name: "wrong password", URL: "etcd://root:wrong-" + pw + "@" + addr + "/?dial_timeout=3s&" + files, WantErr: "authentication failed", Secret: "wrong-" + pw},
		{Name: "wrong CA", URL: base + "server_name=" + testserver.TLSServerName + "&" + ts.URLParams(ts.OtherCAFile, true), WantErr: "x509: certificate signed by unknown authority", Secret: pw},
		{Name: "plaintext against TLS", URL: "etcd://root:" + pw + "@" + addr + "/?dial_timeout=2s", WantErr: "the server speaks TLS", Secret: pw},
		{Name: "TLS asked of a plaintext server", URL: "etcd://" + plain + "/?dial_timeout=3s&" + ts.URLParams(ts.CAFile, false), WantErr: "TLS handshake: " + plain},
		{Name: "no client certificate", URL: base + "server_name=" + testserver.TLSServerName + "&" + ts.URLParams(ts.CAFile, false), WantErr: "certificate required|bad certificate", Secret: pw},
	})
}

// enableAuth turns on etcd's auth with a root user whose password is pw.
func enableAuth(t *testing.T, addr string, ts *testserver.TLS, pw string) {
	t.Helper()
	tc, err := ts.ClientConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	tc.ServerName = testserver.TLSServerName
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, TLS: tc, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithAuthority(testserver.TLSServerName)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.UserAdd(ctx, "root", pw); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestEndpointsParam(t *testing.T) {
	for _, c := range []struct {
		raw, want, err string
		tls            bool
	}{
		{raw: "etcd:///p/?endpoints=https://a:1,https://b", want: "a:1,b:2379", tls: true},
		{raw: "etcd:///?endpoints=http://a:1,c:3", want: "a:1,c:3"},
		{raw: "etcd:///?endpoints=https://a:1,http://b:2", err: "mixes https"},
		{raw: "etcd:///?endpoints=ftp://a:1", err: "want http:// or https://"},
		{raw: "etcd:///?endpoints=https://a:1/x", err: "is not an endpoint"},
		{raw: "etcd://h:1/?endpoints=https://a:1", err: "both"},
	} {
		u, err := url.Parse(c.raw)
		if err != nil {
			t.Fatal(err)
		}
		cfg, _, err := parseURL(u)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.raw, err, c.err)
			}
			continue
		}
		if err != nil || strings.Join(cfg.Endpoints, ",") != c.want || (cfg.TLS != nil) != c.tls {
			t.Errorf("%s: endpoints %v tls %v err %v", c.raw, cfg.Endpoints, cfg.TLS != nil, err)
		}
	}
}
