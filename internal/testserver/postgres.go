package testserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SQLOptions configures a PostgreSQL or MariaDB server. A nil *SQLOptions
// means the defaults.
type SQLOptions struct {
	// Faketime runs the server under libfaketime, so SetClockOffset can jump
	// its wall clock (now(), NOW()). Default off.
	Faketime bool
	// TLS, when set, turns on TLS with TLS's server certificate, and its CA
	// verifies client certificates. Plain connections stay allowed (the
	// harness's own probes use them); tests create users that require TLS
	// (MariaDB's REQUIRE SSL or X509, PostgreSQL's HBA lines). Default off.
	TLS *TLS
	// HBA lines (PostgreSQL only) go before the default "host all all
	// 127.0.0.1/32 trust" in pg_hba.conf, which PostgreSQL reads first to
	// last: e.g. "hostssl all pwuser 127.0.0.1/32 scram-sha-256".
	HBA []string
}

// Postgres starts a PostgreSQL server for t and stops it at t's cleanup: a
// database "dlock" owned by the superuser "dlock", trust authentication, on
// 127.0.0.1. URL is "postgres://dlock@127.0.0.1:port/dlock?sslmode=disable".
// It skips t when PostgreSQL is not installed and fails t if it cannot start.
//
// If DLOCK_TEST_POSTGRES_URL is set, Postgres returns that server instead.
func Postgres(t testing.TB) *Server {
	t.Helper()
	return PostgresWith(t, nil)
}

// PostgresWith is Postgres with options. With DLOCK_TEST_POSTGRES_URL set it
// skips t if o asks for Faketime.
func PostgresWith(t testing.TB, o *SQLOptions) *Server {
	t.Helper()
	if env := strings.TrimSpace(os.Getenv("DLOCK_TEST_POSTGRES_URL")); env != "" {
		if o != nil && (o.Faketime || o.TLS != nil || len(o.HBA) > 0) {
			t.Skip("testserver: DLOCK_TEST_POSTGRES_URL is set, and an external PostgreSQL cannot run under Faketime or with the test's TLS or HBA")
		}
		s, err := externalServer("postgres", env)
		return forTest(t, s, err)
	}
	s, err := StartPostgres(o)
	return forTest(t, s, err)
}

// StartPostgres initialises a database cluster in a temporary directory and
// starts postgres on a free port, waiting until it answers a query. The
// caller must Stop it. It does not look at DLOCK_TEST_POSTGRES_URL.
//
// PostgreSQL refuses to run as root, so when the tests run as root the server
// runs as the user "postgres" (or "nobody" when there is none). Durability
// against power loss is traded for speed (fsync and full_page_writes are off),
// but every commit still reaches the kernel before it is acknowledged, so a
// killed server keeps its committed data: what a crash-restart test of a
// process needs.
func StartPostgres(o *SQLOptions) (*Server, error) {
	return retryPorts(func() (*Server, error) { return startPostgres(o) })
}

func startPostgres(o *SQLOptions) (*Server, error) {
	if o == nil {
		o = &SQLOptions{}
	}
	bindir, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := unprivileged("postgres")
	if err != nil {
		return nil, err
	}
	s, err := newServer("postgres")
	if err != nil {
		return nil, err
	}
	s.cred = cred
	s.stopSig = syscall.SIGINT // fast shutdown: do not wait for clients to leave
	s.stopWait = 5 * time.Second
	if err := chown(s.dir, cred); err != nil {
		os.RemoveAll(s.dir)
		return nil, fmt.Errorf("testserver: postgres: %w", err)
	}
	s.url = "postgres://dlock@" + s.addr + "/dlock?sslmode=disable"
	if o.Faketime {
		if err := s.setupFaketime(); err != nil {
			os.RemoveAll(s.dir)
			return nil, err
		}
	}
	initdb := func(dataDir string) error {
		if err := os.MkdirAll(filepath.Dir(dataDir), 0o755); err != nil {
			return err
		}
		if err := chown(filepath.Dir(dataDir), cred); err != nil {
			return err
		}
		return s.run(exec.Command(filepath.Join(bindir, "initdb"),
			"-D", dataDir, "-U", "dlock", "-A", "trust", "-E", "UTF8",
			"--locale=C", "--no-sync", "--no-instructions"))
	}
	s.initData = func() error {
		tmpl, err := cachedTemplate("postgres-"+binaryKey(filepath.Join(bindir, "postgres"))+"-v1", initdb)
		if err != nil {
			return err
		}
		if tmpl == "" {
			return initdb(s.dataDir)
		}
		if err := copyTree(tmpl, s.dataDir); err != nil {
			return err
		}
		if err := os.Chmod(s.dataDir, 0o700); err != nil {
			return err
		}
		return chown(s.dataDir, cred)
	}
	extra, err := postgresTLSArgs(s, o)
	if err != nil {
		os.RemoveAll(s.dir)
		return nil, fmt.Errorf("testserver: postgres: %w", err)
	}
	s.command = func() *exec.Cmd {
		return exec.Command(filepath.Join(bindir, "postgres"), append([]string{
			"-D", s.dataDir,
			"-p", strconv.Itoa(s.port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=" + s.dir,
			"-c", "fsync=off",
			"-c", "full_page_writes=off",
			"-c", "max_connections=300",
			"-c", "shared_buffers=32MB",
			"-c", "logging_collector=off",
			"-c", "log_min_messages=warning",
			"-c", "max_wal_size=256MB",
			// Dynamic shared memory as files in the data directory, which
			// goes away with it; the default (POSIX shm in /dev/shm)
			// outlives a killed server.
			"-c", "dynamic_shared_memory_type=mmap",
		}, extra...)...)
	}
	s.cleanup = func() { removePostgresShm(s.dataDir) }
	admin := "postgres://dlock@" + s.addr + "/postgres?sslmode=disable&connect_timeout=5"
	s.ready = func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		var one int
		return c.QueryRow(ctx, "SELECT 1").Scan(&one)
	}
	s.after = func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = 'dlock'").Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			if _, err := c.Exec(ctx, "CREATE DATABASE dlock"); err != nil {
				return fmt.Errorf("create database dlock: %w", err)
			}
		}
		return nil
	}
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// postgresTLSArgs returns the server arguments for o.TLS and o.HBA, after
// copying the server's key and certificates into s.dir for its user (the
// server refuses a key that others can read) and writing pg_hba.conf there.
func postgresTLSArgs(s *Server, o *SQLOptions) ([]string, error) {
	var args []string
	if o.TLS != nil {
		for _, f := range []struct{ src, name, arg string }{
			{o.TLS.ServerCertFile, "server.crt", "ssl_cert_file"},
			{o.TLS.ServerKeyFile, "server.key", "ssl_key_file"},
			{o.TLS.CAFile, "ca.crt", "ssl_ca_file"},
		} {
			b, err := os.ReadFile(f.src)
			if err != nil {
				return nil, err
			}
			dst := filepath.Join(s.dir, f.name)
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				return nil, err
			}
			if err := chown(dst, s.cred); err != nil {
				return nil, err
			}
			args = append(args, "-c", f.arg+"="+dst)
		}
		args = append(args, "-c", "ssl=on")
	}
	if len(o.HBA) > 0 {
		lines := append(append([]string{}, o.HBA...),
			"local all all trust",
			"host all all 127.0.0.1/32 trust",
			"host all all ::1/128 trust")
		dst := filepath.Join(s.dir, "pg_hba.conf")
		if err := os.WriteFile(dst, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
		if err := chown(dst, s.cred); err != nil {
			return nil, err
		}
		args = append(args, "-c", "hba_file="+dst)
	}
	return args, nil
}

// postgresBinDir finds PostgreSQL's server programs: Debian keeps them in
// /usr/lib/postgresql/<major>/bin (the newest is taken), others put them in
// PATH.
func postgresBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("%w: PostgreSQL initdb (Debian package postgresql)", ErrNotInstalled)
}

// unprivileged returns the credentials to run a server that refuses root
// under: nil when the tests do not run as root, else those of user name (or
// of "nobody").
func unprivileged(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		u, err = user.Lookup("nobody")
	}
	if err != nil {
		return nil, fmt.Errorf("testserver: running as root and found neither user %q nor \"nobody\" to run the server as", name)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("testserver: user %q has a non-numeric uid or gid", u.Username)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// removePostgresShm removes the System V shared memory segment named in a
// dead server's postmaster.pid. A server that exits cleanly removes it
// itself; a killed one leaves it behind until a restart on the same data
// directory reuses it, so Stop and a wiped Restart remove it.
func removePostgresShm(dataDir string) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 7 {
		return
	}
	f := strings.Fields(lines[6]) // "key shmid"
	if len(f) != 2 {
		return
	}
	id, err := strconv.Atoi(f[1])
	if err != nil || id < 0 {
		return
	}
	const ipcRmid = 0
	_, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), ipcRmid, 0)
}
