package testserver

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// RedisOptions configures a redis-server. A nil *RedisOptions means the
// defaults: no persistence at all, real clock.
type RedisOptions struct {
	// AppendOnly turns on the append-only file with appendfsync always, so
	// every acknowledged write survives Kill and Restart(false). Default off:
	// a killed server comes back empty.
	AppendOnly bool
	// Faketime runs the server under libfaketime, so SetClockOffset can jump
	// its clock (TIME, key expiry). Default off.
	Faketime bool
	// TLS, when set, makes the server speak only TLS on its port with
	// TLS's server certificate (the URL is then rediss://). Default plain.
	TLS *TLS
	// ClientAuth makes a TLS server require a client certificate signed by
	// TLS's CA. Default off: clients need none.
	ClientAuth bool
	// Password, when set, is required of every client (requirepass; the
	// default user's password). It is not put in the URL.
	Password string
}

// Redis starts a redis-server for t and stops it at t's cleanup. It skips t
// when redis-server is not installed and fails t if it cannot start.
//
// If DLOCK_TEST_REDIS_URL is set (e.g. "redis://127.0.0.1:6379/0"), Redis
// returns that server instead, and skips t if o asks for an option an
// external server cannot guarantee.
func Redis(t testing.TB, o *RedisOptions) *Server {
	t.Helper()
	if urls := envList("DLOCK_TEST_REDIS_URL"); len(urls) > 0 {
		if o != nil && (o.AppendOnly || o.Faketime || o.TLS != nil || o.Password != "") {
			t.Skip("testserver: DLOCK_TEST_REDIS_URL is set, and an external Redis cannot guarantee AppendOnly, Faketime, TLS or Password")
		}
		s, err := externalServer("redis", urls[0])
		return forTest(t, s, err)
	}
	s, err := StartRedis(o)
	return forTest(t, s, err)
}

// RedisN starts n independent redis-servers (for Redlock) in parallel, for t.
// With DLOCK_TEST_REDIS_URL set to a comma-separated list of at least n URLs,
// it returns the first n of those instead (and skips t if there are fewer).
func RedisN(t testing.TB, n int, o *RedisOptions) []*Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("testserver: RedisN: n = %d, want at least 1", n)
	}
	if urls := envList("DLOCK_TEST_REDIS_URL"); len(urls) > 0 {
		if len(urls) < n {
			t.Skipf("testserver: DLOCK_TEST_REDIS_URL lists %d servers, the test needs %d independent ones", len(urls), n)
		}
		out := make([]*Server, n)
		for i := range out {
			s, err := externalServer("redis", urls[i])
			out[i] = forTest(t, s, err)
		}
		return out
	}
	out := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = StartRedis(o)
		}()
	}
	wg.Wait()
	for i := range out {
		if errs[i] != nil {
			for _, s := range out {
				if s != nil {
					s.Stop()
				}
			}
			forTest(t, nil, errs[i]) // skips or fails
		}
	}
	for _, s := range out {
		forTest(t, s, nil)
	}
	return out
}

// StartRedis starts a redis-server and waits until it answers PING. The
// caller must Stop it. It does not look at DLOCK_TEST_REDIS_URL.
func StartRedis(o *RedisOptions) (*Server, error) {
	return retryPorts(func() (*Server, error) { return startRedis(o) })
}

func startRedis(o *RedisOptions) (*Server, error) {
	if o == nil {
		o = &RedisOptions{}
	}
	bin, err := lookPath("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
	if err != nil {
		return nil, err
	}
	s, err := newServer("redis")
	if err != nil {
		return nil, err
	}
	s.url = "redis://" + s.addr + "/0"
	if o.TLS != nil {
		s.url = "rediss://" + s.addr + "/0"
	}
	if o.Faketime {
		s.preload = []string{"libc.so.6"} // see faketimeEnv
		if err := s.setupFaketime(); err != nil {
			os.RemoveAll(s.dir)
			return nil, err
		}
	}
	s.initData = func() error { return os.MkdirAll(s.dataDir, 0o755) }
	s.command = func() *exec.Cmd {
		args := []string{
			"--bind", "127.0.0.1",
			"--dir", s.dataDir,
			"--daemonize", "no",
			"--protected-mode", "no",
			"--enable-debug-command", "local",
			"--logfile", "",
			"--save", "",
		}
		args = append(args, redisTLSArgs(s.port, o)...)
		if o.Password != "" {
			args = append(args, "--requirepass", o.Password)
		}
		if o.AppendOnly {
			args = append(args, "--appendonly", "yes", "--appendfsync", "always")
		} else {
			args = append(args, "--appendonly", "no")
		}
		return exec.Command(bin, args...)
	}
	s.ready = func(ctx context.Context) error { return redisPing(ctx, s.addr, o) }
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// redisTLSArgs returns the port arguments of redis-server: a plain port, or
// with o.TLS a TLS port and no plain one.
func redisTLSArgs(port int, o *RedisOptions) []string {
	if o.TLS == nil {
		return []string{"--port", strconv.Itoa(port)}
	}
	auth := "no"
	if o.ClientAuth {
		auth = "yes"
	}
	return []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", o.TLS.ServerCertFile,
		"--tls-key-file", o.TLS.ServerKeyFile,
		"--tls-ca-cert-file", o.TLS.CAFile,
		"--tls-auth-clients", auth,
	}
}

// redisPing sends PING in RESP (after AUTH when o has a password, over TLS
// when o has TLS) and expects +PONG (a loading server answers -LOADING,
// which counts as not ready).
func redisPing(ctx context.Context, addr string, o *RedisOptions) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if o.TLS != nil {
		tc, err := o.TLS.ClientConfig(true)
		if err != nil {
			return err
		}
		c = tls.Client(c, tc)
	}
	r := bufio.NewReader(c)
	if o.Password != "" {
		cmd := fmt.Sprintf("*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(o.Password), o.Password)
		if _, err := c.Write([]byte(cmd)); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if strings.TrimSpace(line) != "+OK" {
			return errors.New("AUTH refused")
		}
	}
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// envList splits a comma-separated environment variable, dropping blanks.
func envList(name string) []string {
	var out []string
	for _, f := range strings.Split(os.Getenv(name), ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
