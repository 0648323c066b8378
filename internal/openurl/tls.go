package openurl

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
)

// TLSParamNames are the URL parameters with which every TLS-capable backend
// takes its TLS files, under the same names: the CA to trust, the client
// certificate and its key (for mutual TLS), and the name to verify in the
// server's certificate instead of the dialled host.
var TLSParamNames = []string{"ca_file", "cert_file", "key_file", "server_name"}

// TLSParams holds the TLS parameters of a URL (see TLSParamNames). File
// paths are not secret: errors name them.
type TLSParams struct {
	CAFile     string // ca_file: PEM certificates of the CAs to trust instead of the system's
	CertFile   string // cert_file: PEM client certificate (with KeyFile)
	KeyFile    string // key_file: PEM key of CertFile
	ServerName string // server_name: the name the server's certificate must carry
}

// TakeTLS removes the TLS parameters from q and returns them (the last value
// of each wins). cert_file and key_file must come together; an empty value
// is refused. Its errors are *Error values naming the parameter.
func TakeTLS(q url.Values) (TLSParams, error) {
	var p TLSParams
	dst := []*string{&p.CAFile, &p.CertFile, &p.KeyFile, &p.ServerName}
	for i, name := range TLSParamNames {
		vs, ok := q[name]
		if !ok {
			continue
		}
		q.Del(name)
		v := vs[len(vs)-1]
		if v == "" {
			return p, BadURL("URL parameter %s is empty", name)
		}
		*dst[i] = v
	}
	if (p.CertFile == "") != (p.KeyFile == "") {
		return p, BadURL("URL parameters cert_file and key_file must be given together")
	}
	return p, nil
}

// TakeTLSOn is TakeTLS that also takes the parameter tls (true or false,
// 1 or 0) and reports whether TLS is asked for: by tls=true or by any of
// the TLS parameters. tls=false with a TLS parameter is refused, as is
// another value of tls.
func TakeTLSOn(q url.Values) (p TLSParams, on bool, err error) {
	explicit := ""
	if vs, ok := q["tls"]; ok {
		q.Del("tls")
		switch v := vs[len(vs)-1]; v {
		case "true", "1":
			explicit = "true"
		case "false", "0":
			explicit = "false"
		default:
			return p, false, BadURL("URL parameter tls: want true or false, got %q", v)
		}
	}
	p, err = TakeTLS(q)
	if err != nil {
		return p, false, err
	}
	if explicit == "false" && p.Any() {
		return p, false, BadURL("URL parameter tls=false contradicts the TLS parameters given (%s)", "ca_file, cert_file, key_file, server_name")
	}
	return p, explicit == "true" || p.Any(), nil
}

// Any reports whether any TLS parameter was given: each of them asks for TLS.
func (p TLSParams) Any() bool { return p != TLSParams{} }

// Apply reads the files p names into c: RootCAs from CAFile, the client
// certificate from CertFile and KeyFile, and ServerName. Parameters not
// given leave c's fields as they are. Its errors are *Error values naming
// the parameter and the file.
func (p TLSParams) Apply(c *tls.Config) error {
	if p.CAFile != "" {
		b, err := os.ReadFile(p.CAFile)
		if err != nil {
			return BadURL("URL parameter ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return BadURL("URL parameter ca_file: %s holds no PEM certificate", p.CAFile)
		}
		c.RootCAs = pool
	}
	if p.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
		if err != nil {
			return BadURL("URL parameters cert_file and key_file (%s, %s): %w", p.CertFile, p.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if p.ServerName != "" {
		c.ServerName = p.ServerName
	}
	return nil
}

// Config returns a new client configuration (TLS 1.2 or later, verifying
// the server against the system's roots unless CAFile is given) with p
// applied.
func (p TLSParams) Config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if err := p.Apply(c); err != nil {
		return nil, err
	}
	return c, nil
}
