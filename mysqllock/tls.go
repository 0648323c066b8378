package mysqllock

import (
	"crypto/tls"
	"fmt"
	"net/url"

	"github.com/dlock/dlock/internal/openurl"
)

// takeTLS takes the TLS parameters every backend shares (ca_file,
// cert_file, key_file, server_name; see openurl.TLSParamNames) out of u and
// returns u without them and the TLS configuration they describe, nil when
// none is given. Any of them asks for verified TLS with no plaintext
// fallback; go-sql-driver's own tls parameter may then only say true.
func takeTLS(u *url.URL) (*url.URL, *tls.Config, error) {
	q := u.Query()
	tp, err := openurl.TakeTLS(q)
	if err != nil {
		return nil, nil, fmt.Errorf("mysqllock: %w", err)
	}
	if !tp.Any() {
		return u, nil, nil
	}
	if v, ok := q["tls"]; ok {
		if v[len(v)-1] != "true" {
			return nil, nil, openurl.BadURL("mysqllock: URL parameter tls=%s contradicts ca_file, cert_file, key_file or server_name (which ask for verified TLS)", v[len(v)-1])
		}
		q.Del("tls")
	}
	tc, err := tp.Config()
	if err != nil {
		return nil, nil, fmt.Errorf("mysqllock: %w", err)
	}
	rest := *u
	rest.RawQuery = q.Encode()
	return &rest, tc, nil
}
