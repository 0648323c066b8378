package testserver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock/internal/testserver"
)

func pgQuery(ctx context.Context, url, q string, args ...any) (string, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	var s string
	err = c.QueryRow(ctx, q, args...).Scan(&s)
	return s, err
}

func pgExec(ctx context.Context, url, q string) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, q)
	return err
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := testserver.Postgres(t)
	t.Logf("postgres started in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if who, err := pgQuery(ctx, s.URL(), "SELECT current_user || '@' || current_database()"); err != nil || who != "dlock@dlock" {
		t.Fatalf("current user@db = %q, %v; want dlock@dlock", who, err)
	}
	if err := pgExec(ctx, s.URL(), "CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')"); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := pgQuery(ctx, s.URL(), "SELECT 'x'"); err == nil {
		t.Fatal("a killed server answered")
	}
	if err := s.Restart(false); err != nil {
		t.Fatal(err)
	}
	if v, err := pgQuery(ctx, s.URL(), "SELECT v FROM t"); err != nil || v != "kept" {
		t.Fatalf("after kill+restart: %q, %v; want the committed row", v, err)
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := pgQuery(pctx, s.URL(), "SELECT 'x'")
	pcancel()
	if err == nil {
		t.Fatal("a paused server answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}

	if err := s.Restart(true); err != nil {
		t.Fatal(err)
	}
	if _, err := pgQuery(ctx, s.URL(), "SELECT v FROM t"); err == nil {
		t.Fatal("table t survived a wiped restart")
	}
	if who, err := pgQuery(ctx, s.URL(), "SELECT current_database()"); err != nil || who != "dlock" {
		t.Fatalf("database after a wiped restart = %q, %v", who, err)
	}
}

func TestPostgresFaketime(t *testing.T) {
	t.Parallel()
	s := testserver.PostgresWith(t, &testserver.SQLOptions{Faketime: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	epoch := func() time.Time {
		t.Helper()
		c, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		var f float64
		if err := c.QueryRow(ctx, "SELECT extract(epoch FROM clock_timestamp())::float8").Scan(&f); err != nil {
			t.Fatal(err)
		}
		return time.Unix(0, int64(f*1e9))
	}
	before := epoch()
	if err := s.SetClockOffset(-time.Hour); err != nil {
		t.Fatal(err)
	}
	if jump := epoch().Sub(before); jump > -time.Hour+time.Minute || jump < -time.Hour-time.Minute {
		t.Fatalf("clock_timestamp() moved by %v after SetClockOffset(-1h)", jump)
	}
}

func TestMariaDB(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := testserver.MariaDB(t)
	t.Logf("mariadb started in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := sql.Open("mysql", s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxIdleConns(0) // every query dials: a killed server cannot hide behind a pooled connection
	var dbname string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&dbname); err != nil || dbname != "dlock" {
		t.Fatalf("DATABASE() = %q, %v", dbname, err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (v VARCHAR(10)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES ('kept')"); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("a killed server answered")
	}
	if err := s.Restart(false); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT v FROM t").Scan(&v); err != nil || v != "kept" {
		t.Fatalf("after kill+restart: %q, %v; want the committed row", v, err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = db.PingContext(pctx)
	pcancel()
	if err == nil {
		t.Fatal("a paused server answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(true); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT v FROM t").Scan(&v); err == nil {
		t.Fatal("table t survived a wiped restart")
	}
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&dbname); err != nil || dbname != "dlock" {
		t.Fatalf("DATABASE() after a wiped restart = %q, %v", dbname, err)
	}
}

func TestMariaDBFaketime(t *testing.T) {
	t.Parallel()
	s := testserver.MariaDBWith(t, &testserver.SQLOptions{Faketime: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := sql.Open("mysql", s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	epoch := func() time.Time {
		t.Helper()
		var f float64
		if err := db.QueryRowContext(ctx, "SELECT UNIX_TIMESTAMP(SYSDATE(6))").Scan(&f); err != nil {
			t.Fatal(err)
		}
		return time.Unix(0, int64(f*1e9))
	}
	before := epoch()
	if err := s.SetClockOffset(90 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if jump := epoch().Sub(before); jump < 89*time.Minute || jump > 91*time.Minute {
		t.Fatalf("SYSDATE() moved by %v after SetClockOffset(90m)", jump)
	}
}

// skipRecorder is a testing.TB whose Skip records the message instead of
// ending the test, so the skipping path can be checked without a skip in the
// report (in CI a skipped test here fails the run).
type skipRecorder struct {
	testing.TB
	skipped string
}

func (r *skipRecorder) Skip(args ...any)                 { r.skipped = fmt.Sprint(args...) }
func (r *skipRecorder) Skipf(format string, args ...any) { r.skipped = fmt.Sprintf(format, args...) }

func TestExternalServer(t *testing.T) {
	t.Setenv("DLOCK_TEST_REDIS_URL", "redis://127.0.0.1:1/0")
	s, err := testserver.StartRedis(nil) // the Start* form ignores the variable
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.External() {
		t.Fatal("StartRedis returned an external server")
	}
	rec := &skipRecorder{TB: t}
	ext := testserver.Redis(rec, nil)
	if !ext.External() || ext.URL() != "redis://127.0.0.1:1/0" || ext.Addr() != "127.0.0.1:1" {
		t.Fatalf("external server: external=%v url=%q addr=%q", ext.External(), ext.URL(), ext.Addr())
	}
	err = ext.Kill()
	if !errors.Is(err, testserver.ErrExternal) || !strings.Contains(rec.skipped, "external") {
		t.Fatalf("Kill on an external server: err = %v, skip message %q; want ErrExternal and a skip", err, rec.skipped)
	}
	ext.Stop() // does nothing, and must not panic

	t.Setenv("DLOCK_TEST_MYSQL_URL", "mysql://u:p%40ss@db.example:3307/app?tls=true")
	m := testserver.MariaDB(rec)
	if want := "u:p@ss@tcp(db.example:3307)/app?parseTime=true&tls=true"; m.DSN() != want {
		t.Fatalf("DSN() = %q, want %q", m.DSN(), want)
	}
	t.Setenv("DLOCK_TEST_ETCD_URL", "http://a:2379,http://b:2379")
	if got := testserver.Etcd(rec, 1).URL(); got != "etcd://a:2379,b:2379" {
		t.Fatalf("external etcd URL() = %q", got)
	}
	t.Setenv("DLOCK_TEST_ZK_URL", "zk://a:2181,b:2181/root")
	z := testserver.ZooKeeper(rec, 2)
	if got := z.Endpoints(); len(got) != 2 || got[0] != "a:2181" || got[1] != "b:2181" || z.URL() != "zk://a:2181,b:2181/root" {
		t.Fatalf("external zk: endpoints %q, URL %q", got, z.URL())
	}
}
