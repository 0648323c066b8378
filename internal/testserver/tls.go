package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSServerName is the DNS name, besides localhost, 127.0.0.1 and ::1, that
// the server certificate of a TLS set names. A client that dials 127.0.0.1
// and asks for this name (server_name) verifies; one that asks for another
// name does not.
const TLSServerName = "server.dlock.test"

// TLSClientName is the common name of the client certificate of a TLS set:
// the user name a server that maps certificates to users (PostgreSQL's cert
// authentication, MariaDB's REQUIRE SUBJECT) sees.
const TLSClientName = "dlock"

// TLS is a set of PEM files made at run time for tests: a CA, a server
// certificate and a client certificate signed by it, and a second CA that
// signed neither (the wrong CA). Keys are ECDSA P-256 in PKCS#8, which every
// server here reads. The files live in Dir; nothing is kept in the repo.
type TLS struct {
	Dir            string
	CAFile         string // the CA that signed the server and client certificates
	ServerCertFile string // for localhost, 127.0.0.1, ::1 and TLSServerName
	ServerKeyFile  string
	ClientCertFile string // common name TLSClientName, for client authentication
	ClientKeyFile  string
	OtherCAFile    string // a CA that signed nothing here: verifying against it fails

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// NewTLS makes a TLS set in t's temporary directory, failing t on error.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	s, err := MakeTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// MakeTLS makes a TLS set in dir, which must exist. The certificates are
// valid from an hour ago for a day.
func MakeTLS(dir string) (*TLS, error) {
	s := &TLS{
		Dir:            dir,
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
		OtherCAFile:    filepath.Join(dir, "other-ca.pem"),
	}
	ca, caKey, err := makeCert("dlock test CA", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	s.ca, s.caKey = ca, caKey
	other, _, err := makeCert("dlock other CA", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	server, serverKey, err := makeCert("dlock test server", ca, caKey, func(c *x509.Certificate) {
		c.DNSNames = []string{"localhost", TLSServerName}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	})
	if err != nil {
		return nil, err
	}
	client, clientKey, err := makeCert(TLSClientName, ca, caKey, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	if err != nil {
		return nil, err
	}
	serverDER, err := x509.MarshalPKCS8PrivateKey(serverKey)
	if err != nil {
		return nil, fmt.Errorf("testserver: tls: %w", err)
	}
	clientDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	if err != nil {
		return nil, fmt.Errorf("testserver: tls: %w", err)
	}
	for _, f := range []struct {
		path, kind string
		der        []byte
		mode       os.FileMode
	}{
		{s.CAFile, "CERTIFICATE", ca.Raw, 0o644},
		{s.OtherCAFile, "CERTIFICATE", other.Raw, 0o644},
		{s.ServerCertFile, "CERTIFICATE", server.Raw, 0o644},
		{s.ServerKeyFile, "PRIVATE KEY", serverDER, 0o600},
		{s.ClientCertFile, "CERTIFICATE", client.Raw, 0o644},
		{s.ClientKeyFile, "PRIVATE KEY", clientDER, 0o600},
	} {
		b := pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der})
		if err := os.WriteFile(f.path, b, f.mode); err != nil {
			return nil, fmt.Errorf("testserver: tls: %w", err)
		}
	}
	return s, nil
}

// NameOnly returns a copy of s whose server certificate names only
// TLSServerName (no address, not localhost): a client that dials 127.0.0.1
// verifies it only when told to expect TLSServerName (server_name). The new
// certificate and key are written next to s's files.
func (s *TLS) NameOnly() (*TLS, error) {
	cert, key, err := makeCert("dlock test server (name only)", s.ca, s.caKey, func(c *x509.Certificate) {
		c.DNSNames = []string{TLSServerName}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	})
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("testserver: tls: %w", err)
	}
	n := *s
	n.ServerCertFile = filepath.Join(s.Dir, "server-name-only.pem")
	n.ServerKeyFile = filepath.Join(s.Dir, "server-name-only-key.pem")
	if err := os.WriteFile(n.ServerCertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644); err != nil {
		return nil, fmt.Errorf("testserver: tls: %w", err)
	}
	if err := os.WriteFile(n.ServerKeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, fmt.Errorf("testserver: tls: %w", err)
	}
	return &n, nil
}

// makeCert makes a certificate named cn and its key: a CA signed by itself
// when parent is nil, else a leaf signed by parent, shaped by edit.
func makeCert(cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, edit func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("testserver: tls: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, fmt.Errorf("testserver: tls: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"dlock tests"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if parent == nil {
		tmpl.IsCA = true
		tmpl.BasicConstraintsValid = true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("testserver: tls: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("testserver: tls: %w", err)
	}
	return cert, key, nil
}

// URLParams returns the TLS query parameters of a dlock URL that trust
// caFile (CAFile or OtherCAFile) and, with withCert, present the client
// certificate: "ca_file=…&cert_file=…&key_file=…", escaped.
func (s *TLS) URLParams(caFile string, withCert bool) string {
	q := "ca_file=" + url.QueryEscape(caFile)
	if withCert {
		q += "&cert_file=" + url.QueryEscape(s.ClientCertFile) + "&key_file=" + url.QueryEscape(s.ClientKeyFile)
	}
	return q
}

// ClientConfig returns a client configuration that trusts the set's CA and,
// with withCert, presents the client certificate.
func (s *TLS) ClientConfig(withCert bool) (*tls.Config, error) {
	pem, err := os.ReadFile(s.CAFile)
	if err != nil {
		return nil, fmt.Errorf("testserver: tls: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(s.ClientCertFile, s.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("testserver: tls: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
