package testserver

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// MariaDB starts a MariaDB server for t and stops it at t's cleanup: a
// database "dlock", user root with an empty password over TCP on 127.0.0.1.
// URL is "mysql://root@127.0.0.1:port/dlock" and DSN the go-sql-driver form.
// It skips t when MariaDB is not installed and fails t if it cannot start.
//
// If DLOCK_TEST_MYSQL_URL is set ("mysql://user:password@host:port/db"),
// MariaDB returns that server instead (any MySQL-compatible server).
func MariaDB(t testing.TB) *Server {
	t.Helper()
	return MariaDBWith(t, nil)
}

// MariaDBWith is MariaDB with options. With DLOCK_TEST_MYSQL_URL set it skips
// t if o asks for Faketime.
func MariaDBWith(t testing.TB, o *SQLOptions) *Server {
	t.Helper()
	if env := strings.TrimSpace(os.Getenv("DLOCK_TEST_MYSQL_URL")); env != "" {
		if o != nil && (o.Faketime || o.TLS != nil) {
			t.Skip("testserver: DLOCK_TEST_MYSQL_URL is set, and an external MySQL cannot run under Faketime or with the test's TLS")
		}
		s, err := externalServer("mariadb", env)
		if err == nil {
			s.dsn, err = mysqlDSN(env)
		}
		return forTest(t, s, err)
	}
	s, err := StartMariaDB(o)
	return forTest(t, s, err)
}

// StartMariaDB initialises a data directory with mariadb-install-db and
// starts mariadbd on a free port, waiting until it answers a query. The
// caller must Stop it. It does not look at DLOCK_TEST_MYSQL_URL.
//
// The server runs without the binary log and with
// innodb_flush_log_at_trx_commit=2: a killed server keeps its committed data
// (the kernel still has it), which is what a crash-restart test of a process
// needs.
func StartMariaDB(o *SQLOptions) (*Server, error) {
	return retryPorts(func() (*Server, error) { return startMariaDB(o) })
}

func startMariaDB(o *SQLOptions) (*Server, error) {
	if o == nil {
		o = &SQLOptions{}
	}
	mariadbd, err := lookPath("mariadbd", "/usr/sbin/mariadbd", "/usr/sbin/mysqld", "/usr/local/bin/mariadbd")
	if err != nil {
		return nil, err
	}
	installDB, err := lookPath("mariadb-install-db", "/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db", "/usr/local/bin/mariadb-install-db")
	if err != nil {
		return nil, err
	}
	s, err := newServer("mariadb")
	if err != nil {
		return nil, err
	}
	s.url = "mysql://root@" + s.addr + "/dlock"
	s.dsn = "root@tcp(" + s.addr + ")/dlock?parseTime=true"
	if o.Faketime {
		if err := s.setupFaketime(); err != nil {
			os.RemoveAll(s.dir)
			return nil, err
		}
	}
	// Options shared by the bootstrap and the server (the redo log size must
	// agree).
	common := []string{
		"--skip-name-resolve",
		"--innodb-buffer-pool-size=32M",
		"--innodb-log-file-size=8M",
		"--innodb-use-native-aio=0",
	}
	if os.Geteuid() == 0 {
		common = append(common, "--user=root") // mariadbd refuses root without it
	}
	install := func(dataDir string) error {
		args := append([]string{
			"--no-defaults",
			"--datadir=" + dataDir,
			"--auth-root-authentication-method=normal",
			"--skip-test-db",
		}, common...)
		return s.run(exec.Command(installDB, args...))
	}
	s.initData = func() error {
		tmpl, err := cachedTemplate("mariadb-"+binaryKey(mariadbd)+"-v1", install)
		if err != nil {
			return err
		}
		if tmpl == "" {
			return install(s.dataDir)
		}
		return copyTree(tmpl, s.dataDir)
	}
	s.command = func() *exec.Cmd {
		args := append([]string{
			"--no-defaults", // must come first
			"--datadir=" + s.dataDir,
			"--port=" + strconv.Itoa(s.port),
			"--bind-address=127.0.0.1",
			"--socket=" + filepath.Join(s.dir, "mariadb.sock"),
			"--pid-file=" + filepath.Join(s.dir, "mariadb.pid"),
			"--tmpdir=" + s.dir,
			"--skip-log-bin",
			"--innodb-flush-log-at-trx-commit=2",
			"--innodb-doublewrite=0",
			"--performance-schema=OFF",
			"--max-connections=500",
		}, common...)
		if o.TLS != nil {
			args = append(args,
				"--ssl-ca="+o.TLS.CAFile,
				"--ssl-cert="+o.TLS.ServerCertFile,
				"--ssl-key="+o.TLS.ServerKeyFile)
		}
		return exec.Command(mariadbd, args...)
	}
	admin := "root@tcp(" + s.addr + ")/?timeout=5s"
	query := func(ctx context.Context, q string) error {
		db, err := sql.Open("mysql", admin)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, q)
		return err
	}
	s.ready = func(ctx context.Context) error { return query(ctx, "SELECT 1") }
	s.after = func(ctx context.Context) error { return query(ctx, "CREATE DATABASE IF NOT EXISTS dlock") }
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// mysqlDSN turns "mysql://user:password@host:port/db?params" into the
// go-sql-driver form, with parseTime=true unless the URL says otherwise. Its
// errors never contain the password.
func mysqlDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "mysql" || u.Host == "" {
		return "", fmt.Errorf("testserver: DLOCK_TEST_MYSQL_URL must look like mysql://user:password@host:port/db")
	}
	cfg := mysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net, cfg.Addr = "tcp", u.Host
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	cfg.ParseTime = true
	for k, vs := range u.Query() {
		if k == "parseTime" {
			cfg.ParseTime = len(vs) > 0 && vs[0] == "true"
			continue
		}
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params[k] = vs[len(vs)-1]
	}
	return cfg.FormatDSN(), nil
}
