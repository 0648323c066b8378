package main

import (
	"strings"
	"testing"
)

func TestTLSInfo(t *testing.T) {
	for _, tc := range []struct {
		url, env, want string
	}{
		{"sqlite:///tmp/x.db", "", tlsLocal},
		{"mem://x", "", tlsLocal},
		{"redis://h:6379/0", "", tlsNone},
		{"redis://h:6379/0?tls=true", "", tlsVerified},
		{"redis://h:6379/0?ca_file=/ca.pem", "", tlsVerified},
		{"rediss://h:6379/0", "", tlsVerified},
		{"rediss://h:6379/0?skip_verify=true", "", tlsUnverified},
		{"redlock://a:1,b:2,c:3", "", tlsNone},
		{"redlock://a:1,b:2,c:3?server_name=r", "", tlsVerified},
		{"redis-sentinel://a:1,b:2/0?master_name=m", "", tlsNone},
		{"redis-sentinel://a:1,b:2/0?master_name=m&tls=true", "", tlsVerified},
		{"etcd://h1:2379,h2:2379", "", tlsNone},
		{"etcds://h1:2379", "", tlsVerified},
		{"etcd://h1:2379?cert_file=c&key_file=k", "", tlsVerified},
		{"etcd:///locks?endpoints=https://h1:2379,https://h2:2379", "", tlsVerified},
		{"etcd:///locks?endpoints=http://h1:2379", "", tlsNone},
		{"zk://h:2181", "", tlsNone},
		{"zks://h:2281", "", tlsVerified},
		{"zk://h:2181?tls=true", "", tlsVerified},
		{"postgres://u:p@db/app", "", tlsUnverified},
		{"postgres://u:p@db/app", "verify-full", tlsVerified},
		{"postgres://u:p@db/app?sslmode=disable", "verify-full", tlsNone},
		{"postgresql://db/app?sslmode=require", "", tlsUnverified},
		{"postgres://db/app?sslmode=require&sslrootcert=/ca.pem", "", tlsVerified},
		{"postgres://db/app?sslmode=verify-full&sslrootcert=/ca.pem", "", tlsVerified},
		{"postgres://db/app?ca_file=/ca.pem", "", tlsVerified},
		{"mysql://u:p@db:3306/app", "", tlsNone},
		{"mysql://u:p@db:3306/app?tls=true", "", tlsVerified},
		{"mysql://u:p@db:3306/app?tls=skip-verify", "", tlsUnverified},
		{"mysql://u:p@db:3306/app?tls=preferred", "", tlsUnverified},
		{"mysql://u:p@db:3306/app?ca_file=/ca.pem", "", tlsVerified},
		{"nosuch://h", "", tlsLocal},
		{"%zz", "", tlsLocal},
	} {
		env := func(k string) string {
			if k == "PGSSLMODE" {
				return tc.env
			}
			return ""
		}
		if got, why := tlsInfo(tc.url, env); got != tc.want {
			t.Errorf("tlsInfo(%q, PGSSLMODE=%q) = %q (%s), want %q", tc.url, tc.env, got, why, tc.want)
		}
	}
}

// TestReportBackend: a connection over the network that is not verified TLS
// draws a note; -v prints the backend with its password masked.
func TestReportBackend(t *testing.T) {
	for _, tc := range []struct {
		url     string
		verbose bool
		want    string // "" for nothing
	}{
		{"redis://:pw-x@db.example:6379/0", false, "dlock: note: tls: none (redis:// without tls=true or ca_file); see docs/security.md for verified TLS"},
		{"postgres://u:pw-x@db.example/app", false, "dlock: note: tls: unverified (sslmode=prefer, pgx's default: the certificate is not checked"},
		{"redis://:pw-x@127.0.0.1:6379/0", false, ""},
		{"etcd://localhost:2379,[::1]:2379", false, ""},
		{"etcd:///x?endpoints=http://127.0.0.1:2379", false, ""},
		{"etcd:///x?endpoints=http://10.0.0.1:2379", false, "dlock: note: tls: none"},
		{"postgres://u:pw-x@/app", false, ""},
		{"rediss://:pw-x@db.example:6379/0", false, ""},
		{"sqlite:///tmp/x.db", false, ""},
		{"redis://:pw-x@127.0.0.1:6379/0", true, "dlock: backend redis://:xxxxx@127.0.0.1:6379/0; tls: none (redis:// without tls=true or ca_file)"},
		{"mysql://u:pw-x@db.example/app?tls=true", true, "dlock: backend mysql://u:xxxxx@db.example/app?tls=true; tls: verified"},
		{"mem://x", true, "dlock: backend mem://x; tls: not applicable (local)"},
	} {
		te := newTestEnv(nil)
		e := te.env()
		e.addSecrets(tc.url)
		reportBackend(e, tc.url, tc.verbose)
		got := te.stderr.String()
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) || strings.Contains(got, "pw-x") {
			t.Errorf("%s (verbose %v): stderr %q, want %q", tc.url, tc.verbose, got, tc.want)
		}
	}
}
