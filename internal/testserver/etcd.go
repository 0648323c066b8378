package testserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Etcd starts an etcd cluster of 1 or 3 (any n ≥ 1) members for t and stops
// it at t's cleanup. It skips t when etcd is not installed and fails t if the
// cluster cannot start.
//
// If DLOCK_TEST_ETCD_URL is set ("etcd://h1:2379,h2:2379" or
// "h1:2379,h2:2379"), Etcd returns that cluster instead, skipping t if it
// lists fewer endpoints than members.
func Etcd(t testing.TB, members int) *Cluster {
	t.Helper()
	if env := os.Getenv("DLOCK_TEST_ETCD_URL"); strings.TrimSpace(env) != "" {
		return externalCluster(t, "etcd", env, members, etcdLeader)
	}
	c, err := StartEtcd(members)
	return clusterForTest(t, c, err)
}

// EtcdOptions configures an etcd cluster. A nil *EtcdOptions means the
// defaults: plain HTTP for clients.
type EtcdOptions struct {
	// TLS, when set, serves clients over TLS only, with TLS's server
	// certificate (readiness is then checked on a plain metrics port).
	// Peers still talk plain HTTP on loopback. Default off.
	TLS *TLS
	// ClientAuth makes a TLS cluster require a client certificate signed by
	// TLS's CA (--client-cert-auth). Default off.
	ClientAuth bool
}

// EtcdWith is Etcd with options; with DLOCK_TEST_ETCD_URL set it skips t if
// o asks for TLS.
func EtcdWith(t testing.TB, members int, o *EtcdOptions) *Cluster {
	t.Helper()
	if o == nil || o.TLS == nil {
		return Etcd(t, members)
	}
	if env := os.Getenv("DLOCK_TEST_ETCD_URL"); strings.TrimSpace(env) != "" {
		t.Skip("testserver: DLOCK_TEST_ETCD_URL is set, and an external etcd cannot use the test's TLS")
	}
	c, err := retryPorts(func() (*Cluster, error) { return startEtcd(members, o) })
	return clusterForTest(t, c, err)
}

// StartEtcd starts an etcd cluster of the given size from the etcd binary
// (Debian's etcd-server) and waits until every member reports itself healthy.
// The caller must Stop it. It does not look at DLOCK_TEST_ETCD_URL.
//
// Members use a 100ms heartbeat and a 1s election timeout (etcd's defaults),
// so a killed leader is replaced within about two seconds.
func StartEtcd(members int) (*Cluster, error) {
	return retryPorts(func() (*Cluster, error) { return startEtcd(members, nil) })
}

func startEtcd(members int, o *EtcdOptions) (*Cluster, error) {
	if o == nil {
		o = &EtcdOptions{}
	}
	if members < 1 {
		return nil, fmt.Errorf("testserver: StartEtcd: members = %d, want at least 1", members)
	}
	bin, err := lookPath("etcd", "/usr/bin/etcd", "/usr/local/bin/etcd")
	if err != nil {
		return nil, err
	}
	c := &Cluster{kind: "etcd", leader: etcdLeader}
	peerPorts := make([]int, members)
	for i := 0; i < members; i++ {
		s, err := newServer("etcd")
		if err == nil {
			peerPorts[i], err = freePort()
		}
		if err != nil {
			for _, m := range c.Members {
				os.RemoveAll(m.dir)
			}
			return nil, err
		}
		s.url = "etcd://" + s.addr
		c.Members = append(c.Members, s)
	}
	var initial []string
	for i := range c.Members {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, peerPorts[i]))
	}
	token := randomHex(8)
	for i, m := range c.Members {
		m.initData = func() error { return nil } // etcd creates its data directory
		clientURL := "http://" + m.addr
		healthAddr := m.addr
		var tlsArgs []string
		if o.TLS != nil {
			clientURL = "https://" + m.addr
			port, err := freePort()
			if err != nil {
				for _, m := range c.Members {
					os.RemoveAll(m.dir)
				}
				return nil, err
			}
			healthAddr = fmt.Sprintf("127.0.0.1:%d", port)
			tlsArgs = []string{
				"--cert-file", o.TLS.ServerCertFile,
				"--key-file", o.TLS.ServerKeyFile,
				"--trusted-ca-file", o.TLS.CAFile,
				"--listen-metrics-urls", "http://" + healthAddr,
			}
			if o.ClientAuth {
				tlsArgs = append(tlsArgs, "--client-cert-auth")
			}
		}
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPorts[i])
		state := "new"
		if members > 1 {
			// A wiped member cannot bootstrap again under its old identity
			// ("member has already been bootstrapped"): while the others
			// run, it is removed from the cluster and added back as a new
			// member, as an operator replaces a failed disk.
			m.wiped = func() error {
				var err error
				state, err = etcdReplaceMember(c, i, peerURL)
				return err
			}
		}
		m.command = func() *exec.Cmd {
			return exec.Command(bin, append([]string{
				"--name", fmt.Sprintf("m%d", i),
				"--data-dir", m.dataDir,
				"--listen-client-urls", clientURL,
				"--advertise-client-urls", clientURL,
				"--listen-peer-urls", peerURL,
				"--initial-advertise-peer-urls", peerURL,
				"--initial-cluster", strings.Join(initial, ","),
				"--initial-cluster-state", state,
				"--initial-cluster-token", "dlock-test-" + token,
				// A wiped member is removed and added back while one
				// member is down; etcd's strict check would refuse the
				// add until it has seen every peer recently (~5s).
				"--strict-reconfig-check=false",
				"--heartbeat-interval", "100",
				"--election-timeout", "1000",
				"--logger", "zap",
				"--log-outputs", "stderr",
				"--log-level", "warn",
			}, tlsArgs...)...)
		}
		m.ready = func(ctx context.Context) error { return etcdHealth(ctx, healthAddr) }
	}
	if err := startMembers(c.Members); err != nil {
		return nil, err
	}
	return c, nil
}

// etcdReplaceMember removes member i (whose data was wiped) from the running
// cluster and adds it back under a new ID, returning the
// --initial-cluster-state it must start with: "existing", or "new" when no
// other member is running (the whole cluster is being started afresh).
func etcdReplaceMember(c *Cluster, i int, peerURL string) (string, error) {
	if c.fresh.Load() {
		return "new", nil // Cluster.Restart(true): every member starts afresh
	}
	var via string
	for j, m := range c.Members {
		if j != i && m.Running() {
			via = m.Addr()
			break
		}
	}
	if via == "" {
		return "new", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type member struct {
		ID       string   `json:"ID"`
		PeerURLs []string `json:"peerURLs"`
	}
	var list struct {
		Members []member `json:"members"`
	}
	err := poll(ctx, nil, func(ctx context.Context) error {
		return etcdHTTPBody(ctx, via, "/v3/cluster/member/list", "{}", &list)
	})
	if err != nil {
		return "", fmt.Errorf("etcd member list: %w", err)
	}
	for _, m := range list.Members {
		for _, u := range m.PeerURLs {
			if u != peerURL {
				continue
			}
			err := poll(ctx, nil, func(ctx context.Context) error {
				var out struct{}
				return etcdHTTPBody(ctx, via, "/v3/cluster/member/remove", fmt.Sprintf(`{"ID":%q}`, m.ID), &out)
			})
			if err != nil {
				return "", fmt.Errorf("etcd member remove: %w", err)
			}
		}
	}
	err = poll(ctx, nil, func(ctx context.Context) error {
		var out struct{}
		return etcdHTTPBody(ctx, via, "/v3/cluster/member/add", fmt.Sprintf(`{"peerURLs":[%q]}`, peerURL), &out)
	})
	if err != nil {
		return "", fmt.Errorf("etcd member add: %w", err)
	}
	return "existing", nil
}

// etcdHealth asks a member's /health endpoint, which is true only when the
// member has a leader and can serve requests.
func etcdHealth(ctx context.Context, addr string) error {
	var h struct {
		Health string `json:"health"`
	}
	if err := etcdHTTP(ctx, http.MethodGet, addr, "/health", &h); err != nil {
		return err
	}
	if h.Health != "true" {
		return fmt.Errorf("etcd %s: health %q", addr, h.Health)
	}
	return nil
}

// etcdStatus is the part of the maintenance Status reply (through etcd's
// JSON gateway, which writes uint64s as strings) that Leader needs.
type etcdStatus struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Leader string `json:"leader"`
}

func etcdLeader(c *Cluster) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ids := make([]string, len(c.Members))
	leader := ""
	var lastErr error
	for i, m := range c.Members {
		if !m.Running() {
			continue
		}
		var st etcdStatus
		if err := etcdHTTP(ctx, http.MethodPost, m.Addr(), "/v3/maintenance/status", &st); err != nil {
			lastErr = err
			continue
		}
		ids[i] = st.Header.MemberID
		if st.Leader != "" && st.Leader != "0" {
			leader = st.Leader
		}
	}
	for i, id := range ids {
		if id != "" && id == leader {
			return i, nil
		}
	}
	if lastErr != nil {
		return -1, fmt.Errorf("testserver: etcd leader: no member names a reachable leader (last error: %v)", lastErr)
	}
	return -1, fmt.Errorf("testserver: etcd leader: no member names a reachable leader")
}

// etcdHTTP calls one of etcd's HTTP endpoints and decodes the JSON reply.
// Keep-alives are off so no connection goroutine outlives the call.
func etcdHTTP(ctx context.Context, method, addr, path string, out any) error {
	if method == http.MethodPost {
		return etcdHTTPBody(ctx, addr, path, "{}", out)
	}
	return etcdDo(ctx, method, addr, path, nil, out)
}

// etcdHTTPBody POSTs a JSON body to etcd's gateway.
func etcdHTTPBody(ctx context.Context, addr, path, body string, out any) error {
	return etcdDo(ctx, http.MethodPost, addr, path, strings.NewReader(body), out)
}

func etcdDo(ctx context.Context, method, addr, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, body)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s%s: %s: %s", addr, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("etcd %s%s: %w", addr, path, err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return strconv.FormatInt(time.Now().UnixNano(), 16)
	}
	return hex.EncodeToString(b)
}
