package pglock

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock/internal/openurl/tlstest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestTLSAndAuth opens postgres:// URLs against a PostgreSQL with TLS whose
// pg_hba.conf requires TLS and a SCRAM password of two users, and a client
// certificate of one: the common TLS parameters (ca_file, cert_file,
// key_file, server_name) and pgx's own (sslmode=verify-full&sslrootcert=…)
// both verify the server; a wrong password, a wrong CA, a wrong server name
// and a missing client certificate fail Open with their reason and without
// the password in the error; TLS asked of the package's plaintext server
// fails instead of falling back.
func TestTLSAndAuth(t *testing.T) {
	const pw = "s3cret-Pa55"
	ts := testserver.NewTLS(t)
	srv := testserver.PostgresWith(t, &testserver.SQLOptions{TLS: ts, HBA: []string{
		"hostssl all pwuser 127.0.0.1/32 scram-sha-256",
		"hostssl all certuser 127.0.0.1/32 scram-sha-256 clientcert=verify-ca",
		"host all pwuser,certuser 127.0.0.1/32 reject",
	}})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, u := range []string{"pwuser", "certuser"} {
		if _, err := admin.Exec(ctx, "CREATE USER "+u+" SUPERUSER PASSWORD '"+pw+"'"); err != nil {
			t.Fatal(err)
		}
	}
	ca := ts.URLParams(ts.CAFile, false)
	at := func(user, pass string) string {
		return "postgres://" + user + ":" + pass + "@" + srv.Addr() + "/dlock?connect_timeout=10&"
	}
	plain, err := url.Parse(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := plain.Query()
	q.Del("sslmode")
	q.Set("ca_file", ts.CAFile)
	plain.RawQuery = q.Encode()
	tlstest.Run(t, []tlstest.Case{
		{Name: "verified TLS with password", URL: at("pwuser", pw) + ca},
		{Name: "pgx verify-full with sslrootcert", URL: at("pwuser", pw) + "sslmode=verify-full&sslrootcert=" + url.QueryEscape(ts.CAFile)},
		{Name: "server_name", URL: at("pwuser", pw) + ca + "&server_name=" + testserver.TLSServerName},
		{Name: "mutual TLS", URL: at("certuser", pw) + ts.URLParams(ts.CAFile, true)},
		{Name: "wrong password", URL: at("pwuser", "wrong-"+pw) + ca, WantErr: "password authentication failed", Secret: "wrong-" + pw},
		{Name: "plaintext for a user that requires TLS", URL: at("pwuser", pw) + "sslmode=disable", WantErr: "pg_hba.conf rejects connection", Secret: pw},
		{Name: "missing client certificate", URL: at("certuser", pw) + ca, WantErr: "certificate", Secret: pw},
		{Name: "wrong CA", URL: at("pwuser", pw) + ts.URLParams(ts.OtherCAFile, false), WantErr: "x509: certificate signed by unknown authority", Secret: pw},
		{Name: "wrong server_name", URL: at("pwuser", pw) + ca + "&server_name=other.example", WantErr: "x509: certificate is valid for", Secret: pw},
		{Name: "TLS asked of a plaintext server", URL: plain.String(), WantErr: "server refused TLS connection"},
		// pgx's default, sslmode=prefer, does not verify even a CA it is
		// given (docs/security.md says so): a wrong sslrootcert still opens.
		{Name: "pgx default prefer is unverified", URL: at("pwuser", pw) + "sslrootcert=" + url.QueryEscape(ts.OtherCAFile)},
		{Name: "sslmode=prefer with ca_file", URL: at("pwuser", pw) + "sslmode=prefer&" + ca, WantErr: "contradicts"},
	})
}
