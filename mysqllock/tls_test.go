package mysqllock

import (
	"context"
	"database/sql"
	"net/url"
	"testing"

	"github.com/dlock/dlock/internal/openurl/tlstest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestTLSAndAuth opens mysql:// URLs against a MariaDB with TLS, as users
// that require TLS (REQUIRE SSL) or a client certificate (REQUIRE X509) and
// a password: the CA, the client certificate and the server name come from
// the URL (old code sent ca_file to the server as a session variable); a
// wrong password, a wrong CA and a missing client certificate fail Open with
// their reason and without the password in the error; and TLS asked of the
// package's plaintext server fails instead of falling back.
func TestTLSAndAuth(t *testing.T) {
	const pw = "s3cret-Pa55"
	ts := testserver.NewTLS(t)
	srv := testserver.MariaDBWith(t, &testserver.SQLOptions{TLS: ts})
	db, err := sql.Open("mysql", srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		"CREATE USER 'tlsuser'@'%' IDENTIFIED BY '" + pw + "' REQUIRE SSL",
		"GRANT ALL ON dlock.* TO 'tlsuser'@'%'",
		"CREATE USER 'certuser'@'%' IDENTIFIED BY '" + pw + "' REQUIRE X509",
		"GRANT ALL ON dlock.* TO 'certuser'@'%'",
	} {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	ca := ts.URLParams(ts.CAFile, false)
	at := func(user, pass string) string {
		return "mysql://" + user + ":" + pass + "@" + srv.Addr() + "/dlock?"
	}
	plain, err := url.Parse(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	plain.RawQuery = ca
	tlstest.Run(t, []tlstest.Case{
		{Name: "verified TLS with password", URL: at("tlsuser", pw) + ca},
		{Name: "tls=true and server_name", URL: at("tlsuser", pw) + "tls=true&" + ca + "&server_name=" + testserver.TLSServerName},
		{Name: "mutual TLS", URL: at("certuser", pw) + ts.URLParams(ts.CAFile, true)},
		{Name: "wrong password", URL: at("tlsuser", "wrong-"+pw) + ca, WantErr: "Access denied", Secret: "wrong-" + pw},
		{Name: "no TLS for a user that requires it", URL: at("tlsuser", pw), WantErr: "Access denied", Secret: pw},
		{Name: "missing client certificate", URL: at("certuser", pw) + ca, WantErr: "Access denied", Secret: pw},
		{Name: "wrong CA", URL: at("tlsuser", pw) + ts.URLParams(ts.OtherCAFile, false), WantErr: "x509: certificate signed by unknown authority", Secret: pw},
		{Name: "wrong server_name", URL: at("tlsuser", pw) + ca + "&server_name=other.example", WantErr: "x509: certificate is valid for", Secret: pw},
		{Name: "TLS asked of a plaintext server", URL: plain.String(), WantErr: "TLS requested but server does not support TLS"},
		{Name: "tls=skip-verify with ca_file", URL: at("tlsuser", pw) + "tls=skip-verify&" + ca, WantErr: "contradicts"},
	})
}
