package zklock

// A private ZooKeeper starter for this package's tests, until
// internal/testserver has one.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type zkServer struct {
	addr    string
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{}
	cfgFile string
}

type zkCluster struct {
	members []*zkServer
}

func (c *zkCluster) endpoints() []string {
	var es []string
	for _, m := range c.members {
		es = append(es, m.addr)
	}
	return es
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startZK starts n ZooKeeper servers (standalone when n is 1) with a 100ms
// tick, so sessions may be as short as 200ms.
func startZK(n int) (*zkCluster, error) {
	c := &zkCluster{}
	var servers []string
	for i := range n {
		dir, err := os.MkdirTemp("", "dlock-zk-")
		if err != nil {
			return nil, err
		}
		cp, err1 := freePort()
		pp, err2 := freePort()
		ep, err3 := freePort()
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, err
		}
		c.members = append(c.members, &zkServer{addr: fmt.Sprintf("127.0.0.1:%d", cp), dir: dir})
		servers = append(servers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, pp, ep))
	}
	for i, m := range c.members {
		data := filepath.Join(m.dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			return nil, err
		}
		cfg := []string{
			"tickTime=100", "initLimit=50", "syncLimit=20",
			"dataDir=" + data, "clientPortAddress=127.0.0.1", "clientPort=" + strings.Split(m.addr, ":")[1],
			"minSessionTimeout=200", "maxSessionTimeout=60000",
			"admin.enableServer=false", "4lw.commands.whitelist=*",
			"maxClientCnxns=0",
		}
		if n > 1 {
			cfg = append(cfg, servers...)
			if err := os.WriteFile(filepath.Join(data, "myid"), fmt.Appendf(nil, "%d\n", i+1), 0o644); err != nil {
				return nil, err
			}
		}
		m.cfgFile = filepath.Join(m.dir, "zoo.cfg")
		if err := os.WriteFile(m.cfgFile, []byte(strings.Join(cfg, "\n")+"\n"), 0o644); err != nil {
			return nil, err
		}
		if err := m.start(n > 1); err != nil {
			c.stop()
			return nil, err
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, m := range c.members {
		for !m.serving() {
			if time.Now().After(deadline) {
				c.stop()
				return nil, fmt.Errorf("zookeeper %s not serving in time; log:\n%s", m.addr, m.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}

func (m *zkServer) start(quorum bool) error {
	main := "org.apache.zookeeper.server.ZooKeeperServerMain"
	if quorum {
		main = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
	}
	log, err := os.OpenFile(filepath.Join(m.dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	m.cmd = exec.Command("java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dzookeeper.log.dir="+m.dir, "-Dzookeeper.root.logger=WARN,CONSOLE",
		"-cp", "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar", main, m.cfgFile)
	m.cmd.Stdout, m.cmd.Stderr = log, log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	log.Close()
	m.exited = make(chan struct{})
	go func(cmd *exec.Cmd, ch chan struct{}) { cmd.Wait(); close(ch) }(m.cmd, m.exited)
	return nil
}

// serving asks the server the "ruok"-style "srvr" four-letter word and
// reports whether it serves clients.
func (m *zkServer) serving() bool {
	return strings.Contains(m.fourLetter("srvr"), "Mode:")
}

func (m *zkServer) fourLetter(cmd string) string {
	conn, err := net.DialTimeout("tcp", m.addr, time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	conn.Write([]byte(cmd))
	var buf bytes.Buffer
	buf.ReadFrom(conn)
	return buf.String()
}

func (m *zkServer) running() bool {
	select {
	case <-m.exited:
		return false
	default:
		return m.cmd != nil
	}
}

func (m *zkServer) kill() {
	if m.cmd == nil || !m.running() {
		return
	}
	syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	<-m.exited
}

func (m *zkServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(m.dir, "log"))
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// leader returns the index of the ensemble's leader, or -1.
func (c *zkCluster) leader() int {
	for i, m := range c.members {
		if m.running() && strings.Contains(m.fourLetter("srvr"), "Mode: leader") {
			return i
		}
	}
	return -1
}

func (c *zkCluster) stop() {
	for _, m := range c.members {
		m.kill()
		os.RemoveAll(m.dir)
	}
}
