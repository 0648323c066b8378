package testserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ZooKeeperOptions configures a ZooKeeper server or ensemble. A nil
// *ZooKeeperOptions means the defaults.
type ZooKeeperOptions struct {
	// TickTime is ZooKeeper's basic time unit. Sessions may time out between
	// 2 and 300 ticks. Default 200ms, so tests can use session timeouts from
	// 400ms up.
	TickTime time.Duration
	// Faketime runs the JVMs under libfaketime, so SetClockOffset can jump
	// their wall clocks. Default off.
	Faketime bool
	// TLS, when set, makes each server's client address (Addr) a TLS port
	// (secureClientPort, Netty connection factory, PEM key and trust
	// stores); a plain port stays open on loopback for the readiness probe.
	// Default off.
	TLS *TLS
	// ClientAuth makes a TLS server require a client certificate signed by
	// TLS's CA (ssl.clientAuth=need). Default off.
	ClientAuth bool
}

// DefaultZooKeeperTickTime is the tickTime used when ZooKeeperOptions.TickTime
// is zero.
const DefaultZooKeeperTickTime = 200 * time.Millisecond

// ZooKeeper starts a standalone ZooKeeper (nodes == 1) or an ensemble of nodes
// servers for t, and stops it at t's cleanup. It skips t when Java or
// ZooKeeper is not installed and fails t if the servers cannot start. It uses
// the default options (see ZooKeeperWith).
//
// If DLOCK_TEST_ZK_URL is set ("zk://h1:2181,h2:2181" or "h1:2181,h2:2181"),
// ZooKeeper returns that ensemble instead, skipping t if it lists fewer
// servers than nodes.
func ZooKeeper(t testing.TB, nodes int) *Cluster {
	t.Helper()
	return ZooKeeperWith(t, nodes, nil)
}

// ZooKeeperWith is ZooKeeper with options. With DLOCK_TEST_ZK_URL set it skips
// t if o asks for Faketime.
func ZooKeeperWith(t testing.TB, nodes int, o *ZooKeeperOptions) *Cluster {
	t.Helper()
	if env := os.Getenv("DLOCK_TEST_ZK_URL"); strings.TrimSpace(env) != "" {
		if o != nil && (o.Faketime || o.TLS != nil) {
			t.Skip("testserver: DLOCK_TEST_ZK_URL is set, and an external ZooKeeper cannot run under Faketime or with the test's TLS")
		}
		return externalCluster(t, "zk", env, nodes, zkLeader)
	}
	c, err := StartZooKeeperWith(nodes, o)
	return clusterForTest(t, c, err)
}

// StartZooKeeper starts a standalone ZooKeeper or an ensemble with the
// default options and waits until every server serves requests. The caller
// must Stop it. It does not look at DLOCK_TEST_ZK_URL.
func StartZooKeeper(nodes int) (*Cluster, error) { return StartZooKeeperWith(nodes, nil) }

// StartZooKeeperWith is StartZooKeeper with options.
//
// Each server is a JVM running org.apache.zookeeper.server.quorum.QuorumPeerMain
// from the Debian zookeeper package with a small heap (-Xmx256m), the admin
// server off, all four-letter words allowed, and no fsync (the data lives in
// a temporary directory, usually on tmpfs).
func StartZooKeeperWith(nodes int, o *ZooKeeperOptions) (*Cluster, error) {
	return retryPorts(func() (*Cluster, error) { return startZooKeeper(nodes, o) })
}

func startZooKeeper(nodes int, o *ZooKeeperOptions) (*Cluster, error) {
	if nodes < 1 {
		return nil, fmt.Errorf("testserver: StartZooKeeper: nodes = %d, want at least 1", nodes)
	}
	if o == nil {
		o = &ZooKeeperOptions{}
	}
	tick := o.TickTime
	if tick == 0 {
		tick = DefaultZooKeeperTickTime
	}
	if tick < time.Millisecond {
		return nil, fmt.Errorf("testserver: StartZooKeeper: TickTime %v is below 1ms", tick)
	}
	java, err := lookPath("java", "/usr/bin/java")
	if err != nil {
		return nil, err
	}
	cp, err := zkClasspath()
	if err != nil {
		return nil, err
	}
	if o.TLS != nil {
		// Debian's zookeeper.jar names only part of Netty; TLS needs its
		// codec and resolver too.
		for _, j := range []string{"netty-codec.jar", "netty-resolver.jar", "netty-transport-native-unix-common.jar"} {
			if p := filepath.Join("/usr/share/java", j); fileExists(p) {
				cp += ":" + p
			}
		}
	}
	c := &Cluster{kind: "zk", leader: zkLeader}
	quorumPorts := make([]int, nodes)
	electionPorts := make([]int, nodes)
	for i := 0; i < nodes; i++ {
		s, err := newServer("zk")
		if err == nil {
			quorumPorts[i], err = freePort()
		}
		if err == nil {
			electionPorts[i], err = freePort()
		}
		if err == nil && o.Faketime {
			err = s.setupFaketime()
		}
		if err != nil {
			if s != nil {
				os.RemoveAll(s.dir)
			}
			for _, m := range c.Members {
				os.RemoveAll(m.dir)
			}
			return nil, err
		}
		s.url = "zk://" + s.addr
		c.Members = append(c.Members, s)
	}
	ms := tick.Milliseconds()
	for i, m := range c.Members {
		cfg := []string{
			"tickTime=" + strconv.FormatInt(ms, 10),
			"initLimit=" + strconv.FormatInt(max(10, 10000/ms), 10), // ≥ 10s for a follower to connect and sync
			"syncLimit=" + strconv.FormatInt(max(5, 4000/ms), 10),   // ≥ 4s before a silent follower is dropped
			"minSessionTimeout=" + strconv.FormatInt(2*ms, 10),
			"maxSessionTimeout=" + strconv.FormatInt(300*ms, 10),
			"dataDir=" + m.dataDir,
			"clientPort=" + strconv.Itoa(m.port),
			"clientPortAddress=127.0.0.1",
			"maxClientCnxns=0",
			"admin.enableServer=false",
			"4lw.commands.whitelist=*",
			"forceSync=no",
			"preAllocSize=1024",
			"snapCount=100000",
			"autopurge.purgeInterval=0",
			"reconfigEnabled=false",
		}
		probeAddr := m.addr
		if o.TLS != nil {
			extra, plain, err := zkTLSConfig(m, o)
			if err != nil {
				for _, m := range c.Members {
					os.RemoveAll(m.dir)
				}
				return nil, fmt.Errorf("testserver: zk: %w", err)
			}
			cfg = append(cfg, extra...)
			probeAddr = plain
		}
		if nodes > 1 {
			for j := range c.Members {
				cfg = append(cfg, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", j+1, quorumPorts[j], electionPorts[j]))
			}
		}
		cfgPath := filepath.Join(m.dir, "zoo.cfg")
		if err := os.WriteFile(cfgPath, []byte(strings.Join(cfg, "\n")+"\n"), 0o644); err != nil {
			for _, m := range c.Members {
				os.RemoveAll(m.dir)
			}
			return nil, fmt.Errorf("testserver: zk: %w", err)
		}
		myid := strconv.Itoa(i + 1)
		m.initData = func() error {
			if err := os.MkdirAll(m.dataDir, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(m.dataDir, "myid"), []byte(myid+"\n"), 0o644)
		}
		m.command = func() *exec.Cmd {
			return exec.Command(java,
				"-Xmx256m", "-Xms32m", "-Xss512k",
				"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
				"-Djava.net.preferIPv4Stack=true",
				"-Dzookeeper.admin.enableServer=false",
				// Leader election backs off up to 60s between rounds while
				// peers are still starting (or were killed); cap it at 1s so
				// an ensemble forms within seconds on a loaded machine.
				"-Dzookeeper.fastleader.maxNotificationInterval=1000",
				"-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
				"-Dorg.slf4j.simpleLogger.showDateTime=true",
				"-cp", cp,
				"org.apache.zookeeper.server.quorum.QuorumPeerMain", cfgPath)
		}
		m.ready = func(ctx context.Context) error {
			mode, err := zkMode(ctx, probeAddr)
			if err != nil {
				return err
			}
			if mode == "" {
				return fmt.Errorf("zk %s: not serving requests yet", m.addr)
			}
			return nil
		}
	}
	if err := startMembers(c.Members); err != nil {
		return nil, err
	}
	return c, nil
}

// zkTLSConfig returns the zoo.cfg lines that make m's client port a TLS
// port, and the plain loopback address left for probes. The key store is
// one PEM file holding the server's key and certificate.
func zkTLSConfig(m *Server, o *ZooKeeperOptions) ([]string, string, error) {
	plainPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	key, err := os.ReadFile(o.TLS.ServerKeyFile)
	if err != nil {
		return nil, "", err
	}
	cert, err := os.ReadFile(o.TLS.ServerCertFile)
	if err != nil {
		return nil, "", err
	}
	store := filepath.Join(m.dir, "keystore.pem")
	if err := os.WriteFile(store, append(key, cert...), 0o600); err != nil {
		return nil, "", err
	}
	auth := "none"
	if o.ClientAuth {
		auth = "need"
	}
	return []string{
		"clientPort=" + strconv.Itoa(plainPort),
		"secureClientPort=" + strconv.Itoa(m.port),
		"secureClientPortAddress=127.0.0.1",
		"serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
		"ssl.keyStore.location=" + store,
		"ssl.keyStore.type=PEM",
		"ssl.trustStore.location=" + o.TLS.CAFile,
		"ssl.trustStore.type=PEM",
		"ssl.clientAuth=" + auth,
	}, fmt.Sprintf("127.0.0.1:%d", plainPort), nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// zkClasspath finds the ZooKeeper server classes: Debian's zookeeper.jar
// (whose manifest names its dependencies) plus an SLF4J binding so that the
// server's warnings reach its log, or an upstream tarball's lib directory.
func zkClasspath() (string, error) {
	if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err == nil {
		cp := "/usr/share/java/zookeeper.jar"
		if _, err := os.Stat("/usr/share/java/slf4j-simple.jar"); err == nil {
			cp += ":/usr/share/java/slf4j-simple.jar"
		}
		return cp, nil
	}
	for _, dir := range []string{"/usr/share/zookeeper/lib", "/opt/zookeeper/lib"} {
		if jars, _ := filepath.Glob(filepath.Join(dir, "zookeeper-*.jar")); len(jars) > 0 {
			return dir + "/*", nil
		}
	}
	return "", fmt.Errorf("%w: ZooKeeper (Debian package zookeeper)", ErrNotInstalled)
}

// zk4lw sends a four-letter word and returns the whole answer.
func zk4lw(ctx context.Context, addr, word string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, word); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 1<<16))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// zkMode returns the server's Mode from srvr ("leader", "follower",
// "standalone", …), or "" when it is up but not serving requests (no quorum).
func zkMode(ctx context.Context, addr string) (string, error) {
	out, err := zk4lw(ctx, addr, "srvr")
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if mode, ok := strings.CutPrefix(sc.Text(), "Mode: "); ok {
			return strings.TrimSpace(mode), nil
		}
	}
	if strings.Contains(out, "not currently serving") {
		return "", nil
	}
	return "", fmt.Errorf("zk %s: srvr answered %q", addr, out)
}

func zkLeader(c *Cluster) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var lastErr error
	for i, m := range c.Members {
		if !m.Running() {
			continue
		}
		mode, err := zkMode(ctx, m.Addr())
		if err != nil {
			lastErr = err
			continue
		}
		if mode == "leader" || mode == "standalone" {
			return i, nil
		}
	}
	if lastErr != nil {
		return -1, fmt.Errorf("testserver: zk leader: no reachable server is the leader (last error: %v)", lastErr)
	}
	return -1, fmt.Errorf("testserver: zk leader: no reachable server is the leader")
}
