package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// SentinelMasterName is the name under which a SentinelSet's sentinels
// monitor its master (the master_name of its URL).
const SentinelMasterName = "dlock"

// SentinelOptions configure a SentinelSet. A nil *SentinelOptions means the
// defaults.
type SentinelOptions struct {
	// Replicas is the number of replicas of the master (default 2).
	Replicas int
	// Password, when set, is required of every client of the data nodes
	// (requirepass), used by the replicas towards their master (masterauth)
	// and by the sentinels (auth-pass). The sentinels themselves take no
	// password. It is not put in the URL.
	Password string
	// DownAfter is the sentinels' down-after-milliseconds: how long the
	// master must not answer before a failover starts (default 2s). Keep it
	// above a second, the sentinels' PING period: with 1s, a loaded machine
	// makes Sentinel fail over a live master right after a promotion (seen
	// under -race: +sdown of the new master one second after
	// +switch-master), which no test asked for.
	DownAfter time.Duration
	// FailoverTimeout is the sentinels' failover-timeout (default 2s): a
	// failover not done in this time is retried by another sentinel after
	// twice this.
	FailoverTimeout time.Duration
}

// SentinelSet is a Redis master with its replicas (all redis-server on
// loopback, no persistence) watched by three redis-sentinel processes that
// agree with a quorum of 2 (down-after 2s). Nodes[0] starts as the master. KillMaster,
// AwaitPromotion and Failover act out a master's crash and Sentinel's
// promotion of a replica; the killed node comes back, empty, as a replica of
// the new master. Its methods are safe for concurrent use.
type SentinelSet struct {
	// Nodes are the redis-servers (the master and its replicas) in a fixed
	// order; Master returns an index into it.
	Nodes []*Server
	// Sentinels are the three redis-sentinel processes.
	Sentinels []*Server

	opt SentinelOptions

	mu        sync.Mutex
	replicaOf []string // per node: the master address it starts as a replica of, "" for a master
}

// RedisSentinel starts a SentinelSet for t (see StartRedisSentinel) and stops
// it at t's cleanup. It skips t when redis-server is not installed and fails t
// if the set cannot start. It has no external form: fault controls need
// servers started by the test.
func RedisSentinel(t testing.TB, o *SentinelOptions) *SentinelSet {
	t.Helper()
	s, err := StartRedisSentinel(o)
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range append(append([]*Server{}, s.Nodes...), s.Sentinels...) {
		m.tb = t
	}
	t.Cleanup(s.Stop)
	return s
}

// StartRedisSentinel starts a master, its replicas (each in sync before the
// sentinels start) and three sentinels (redis-server --sentinel), and returns
// once every sentinel names the master, knows every replica and sees the
// other two sentinels. The caller must Stop it.
func StartRedisSentinel(o *SentinelOptions) (*SentinelSet, error) {
	opt := SentinelOptions{Replicas: 2, DownAfter: 2 * time.Second, FailoverTimeout: 2 * time.Second}
	if o != nil {
		opt.Password = o.Password
		if o.Replicas > 0 {
			opt.Replicas = o.Replicas
		}
		if o.DownAfter > 0 {
			opt.DownAfter = o.DownAfter
		}
		if o.FailoverTimeout > 0 {
			opt.FailoverTimeout = o.FailoverTimeout
		}
	}
	bin, err := lookPath("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
	if err != nil {
		return nil, err
	}
	s := &SentinelSet{opt: opt, replicaOf: make([]string, opt.Replicas+1)}
	fail := func(err error) (*SentinelSet, error) {
		s.Stop()
		return nil, err
	}
	master := ""
	for i := 0; i <= opt.Replicas; i++ {
		s.mu.Lock()
		s.replicaOf[i] = master
		s.mu.Unlock()
		n, err := retryPorts(func() (*Server, error) { return s.newNode(bin, i) })
		if err != nil {
			return fail(err)
		}
		s.Nodes = append(s.Nodes, n)
		master = s.Nodes[0].Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.awaitReplicas(ctx, 0); err != nil {
		return fail(err)
	}
	errs := make([]error, 3)
	sents := make([]*Server, 3)
	var wg sync.WaitGroup
	for i := range sents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sents[i], errs[i] = retryPorts(func() (*Server, error) { return s.newSentinel(bin, master) })
		}()
	}
	wg.Wait()
	for _, m := range sents {
		if m != nil {
			s.Sentinels = append(s.Sentinels, m)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	if err := s.Settle(startTimeout); err != nil {
		return fail(err)
	}
	return s, nil
}

// newNode starts data node i: a master until replicaOf[i] is set, then a
// replica of that address at every (re)start.
func (s *SentinelSet) newNode(bin string, i int) (*Server, error) {
	n, err := newServer("redis")
	if err != nil {
		return nil, err
	}
	n.url = "redis://" + n.addr + "/0"
	n.initData = func() error { return os.MkdirAll(n.dataDir, 0o755) }
	n.command = func() *exec.Cmd {
		args := []string{
			"--port", strconv.Itoa(n.port),
			"--bind", "127.0.0.1",
			"--dir", n.dataDir,
			"--daemonize", "no",
			"--protected-mode", "no",
			"--enable-debug-command", "local",
			"--logfile", "",
			"--save", "",
			"--appendonly", "no",
			// A replica that (re)joins gets the data set at once, without
			// writing an RDB file and without waiting for more replicas.
			"--repl-diskless-sync", "yes",
			"--repl-diskless-sync-delay", "0",
			// A stalled replica is never cut off for its backlog: the
			// failover experiments stall replicas on purpose.
			"--client-output-buffer-limit", "replica", "0", "0", "0",
		}
		if p := s.opt.Password; p != "" {
			args = append(args, "--requirepass", p, "--masterauth", p)
		}
		s.mu.Lock()
		of := s.replicaOf[i]
		s.mu.Unlock()
		if of != "" {
			h, p, _ := net.SplitHostPort(of)
			args = append(args, "--replicaof", h, p)
		}
		return exec.Command(bin, args...)
	}
	ro := &RedisOptions{Password: s.opt.Password}
	n.ready = func(ctx context.Context) error { return redisPing(ctx, n.addr, ro) }
	if err := n.launch(); err != nil {
		return nil, err
	}
	return n, nil
}

// newSentinel starts one redis-sentinel monitoring master.
func (s *SentinelSet) newSentinel(bin, master string) (*Server, error) {
	m, err := newServer("redis-sentinel")
	if err != nil {
		return nil, err
	}
	m.url = "redis://" + m.addr
	conf := filepath.Join(m.dataDir, "sentinel.conf")
	m.initData = func() error {
		if err := os.MkdirAll(m.dataDir, 0o755); err != nil {
			return err
		}
		h, p, _ := net.SplitHostPort(master)
		c := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\nlogfile \"\"\ndir %s\n", m.port, m.dataDir) +
			fmt.Sprintf("sentinel monitor %s %s %s 2\n", SentinelMasterName, h, p) +
			fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", SentinelMasterName, s.opt.DownAfter.Milliseconds()) +
			fmt.Sprintf("sentinel failover-timeout %s %d\n", SentinelMasterName, s.opt.FailoverTimeout.Milliseconds()) +
			fmt.Sprintf("sentinel parallel-syncs %s %d\n", SentinelMasterName, s.opt.Replicas)
		if s.opt.Password != "" {
			c += fmt.Sprintf("sentinel auth-pass %s %s\n", SentinelMasterName, s.opt.Password)
		}
		// Sentinel rewrites its configuration file, so it must own one.
		return os.WriteFile(conf, []byte(c), 0o644)
	}
	m.command = func() *exec.Cmd { return exec.Command(bin, conf, "--sentinel") }
	m.ready = func(ctx context.Context) error { return redisPing(ctx, m.addr, &RedisOptions{}) }
	if err := m.launch(); err != nil {
		return nil, err
	}
	return m, nil
}

// SentinelAddrs returns the sentinels' addresses, "127.0.0.1:port".
func (s *SentinelSet) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, m := range s.Sentinels {
		out[i] = m.Addr()
	}
	return out
}

// URL returns "redis-sentinel://S1,S2,S3/0?master_name=dlock", the dlock URL
// of the set (without the password, which goes in a password= parameter).
func (s *SentinelSet) URL() string {
	return "redis-sentinel://" + strings.Join(s.SentinelAddrs(), ",") + "/0?master_name=" + SentinelMasterName
}

// Password returns the data nodes' password, "" for none.
func (s *SentinelSet) Password() string { return s.opt.Password }

// DownAfter is the sentinels' down-after-milliseconds.
func (s *SentinelSet) DownAfter() time.Duration { return s.opt.DownAfter }

// Client returns a go-redis client of data node i (no retries, context
// deadlines honoured); the caller closes it.
func (s *SentinelSet) Client(i int) *redis.Client {
	return nodeClient(s.Nodes[i].Addr(), s.opt.Password)
}

func nodeClient(addr, password string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, Password: password, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: 2 * time.Second, PoolSize: 2,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// indexOf returns the index of the node at addr, -1 if none.
func (s *SentinelSet) indexOf(addr string) int {
	for i, n := range s.Nodes {
		if n.Addr() == addr {
			return i
		}
	}
	return -1
}

// sentinelMasters asks every running sentinel for the master's address;
// "" for a sentinel that did not answer.
func (s *SentinelSet) sentinelMasters(ctx context.Context) []string {
	out := make([]string, len(s.Sentinels))
	var wg sync.WaitGroup
	for i, m := range s.Sentinels {
		if !m.Running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := nodeClient(m.Addr(), "")
			defer c.Close()
			v, err := c.Do(ctx, "SENTINEL", "get-master-addr-by-name", SentinelMasterName).StringSlice()
			if err == nil && len(v) == 2 {
				out[i] = net.JoinHostPort(v[0], v[1])
			}
		}()
	}
	wg.Wait()
	return out
}

// Master returns the index in Nodes of the master a majority of the
// sentinels name, or an error when no majority agrees.
func (s *SentinelSet) Master() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.majorityMaster(ctx)
}

func (s *SentinelSet) majorityMaster(ctx context.Context) (int, error) {
	votes := map[string]int{}
	answers := s.sentinelMasters(ctx)
	for _, a := range answers {
		if a != "" {
			votes[a]++
		}
	}
	for a, n := range votes {
		if n > len(s.Sentinels)/2 {
			if i := s.indexOf(a); i >= 0 {
				return i, nil
			}
			return -1, fmt.Errorf("testserver: the sentinels name %s, which is no node of the set", a)
		}
	}
	return -1, fmt.Errorf("testserver: no majority of sentinels names one master (answers %q)", answers)
}

// info returns the fields of INFO section of node i.
func (s *SentinelSet) info(ctx context.Context, i int, section string) (map[string]string, error) {
	c := s.Client(i)
	defer c.Close()
	txt, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(txt, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out, nil
}

// awaitReplicas waits until node master reports role master and every other
// running node is its replica with the link up.
func (s *SentinelSet) awaitReplicas(ctx context.Context, master int) error {
	return poll(ctx, nil, func(ctx context.Context) error {
		inf, err := s.info(ctx, master, "replication")
		if err != nil {
			return err
		}
		if inf["role"] != "master" {
			return fmt.Errorf("node %d is %s, not master", master, inf["role"])
		}
		for i, n := range s.Nodes {
			if i == master || !n.Running() {
				continue
			}
			ri, err := s.info(ctx, i, "replication")
			if err != nil {
				return err
			}
			if ri["role"] != "slave" || ri["master_port"] != strconv.Itoa(s.Nodes[master].port) || ri["master_link_status"] != "up" {
				return fmt.Errorf("node %d: role %s, master port %s, link %s", i, ri["role"], ri["master_port"], ri["master_link_status"])
			}
		}
		return nil
	})
}

// Settle waits, for at most within, until the set is steady: every
// sentinel names the same master, that node is
// master, every other node replicates it with the link up, and every
// sentinel knows all replicas (none flagged down or disconnected) and the
// other sentinels. A failover can then happen.
func (s *SentinelSet) Settle(within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	err := poll(ctx, nil, func(ctx context.Context) error {
		answers := s.sentinelMasters(ctx)
		for _, a := range answers[1:] {
			if a != answers[0] {
				return fmt.Errorf("the sentinels name different masters: %q", answers)
			}
		}
		master := s.indexOf(answers[0])
		if master < 0 {
			return fmt.Errorf("the sentinels name %q, no node of the set", answers[0])
		}
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		err := s.awaitReplicas(actx, master)
		acancel()
		if err != nil {
			return err
		}
		for _, m := range s.Sentinels {
			if err := s.sentinelSees(ctx, m, master); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testserver: sentinel set not steady within %v: %w", within, err)
	}
	return nil
}

// sentinelSees checks that sentinel m knows every node but master as a
// healthy replica and sees the other sentinels.
func (s *SentinelSet) sentinelSees(ctx context.Context, m *Server, master int) error {
	c := nodeClient(m.Addr(), "")
	defer c.Close()
	mi, err := c.Do(ctx, "SENTINEL", "master", SentinelMasterName).Result()
	if err != nil {
		return err
	}
	fields := flatMap(mi)
	if fields["flags"] != "master" {
		return fmt.Errorf("sentinel %s: master flags %q", m.Addr(), fields["flags"])
	}
	if fields["num-other-sentinels"] != strconv.Itoa(len(s.Sentinels)-1) {
		return fmt.Errorf("sentinel %s sees %s other sentinels", m.Addr(), fields["num-other-sentinels"])
	}
	reps, err := c.Do(ctx, "SENTINEL", "replicas", SentinelMasterName).Slice()
	if err != nil {
		return err
	}
	healthy := 0
	for _, r := range reps {
		f := flatMap(r)
		if f["flags"] == "slave" && f["master-link-status"] == "ok" {
			healthy++
		}
	}
	if healthy != len(s.Nodes)-1 {
		return fmt.Errorf("sentinel %s knows %d healthy replicas, want %d", m.Addr(), healthy, len(s.Nodes)-1)
	}
	return nil
}

// flatMap turns a RESP2 flat list of field, value (or a RESP3 map) into a map.
func flatMap(v any) map[string]string {
	out := map[string]string{}
	switch x := v.(type) {
	case []any:
		for i := 0; i+1 < len(x); i += 2 {
			out[fmt.Sprint(x[i])] = fmt.Sprint(x[i+1])
		}
	case map[any]any:
		for k, val := range x {
			out[fmt.Sprint(k)] = fmt.Sprint(val)
		}
	}
	return out
}

// Failovers returns how many failovers have ended since the set started:
// the most "+switch-master" lines any sentinel has logged. A count above the
// failovers a test caused means Sentinel failed over on its own (a master
// that did not answer PING within DownAfter, as on a badly overloaded
// machine).
func (s *SentinelSet) Failovers() int {
	n := 0
	for _, m := range s.Sentinels {
		b, err := os.ReadFile(m.logPath)
		if err == nil {
			n = max(n, strings.Count(string(b), "+switch-master "))
		}
	}
	return n
}

// KillMaster kills (SIGKILL) the node the sentinels name as master and
// returns its index. Sentinel then promotes a replica once the master has
// not answered for DownAfter; see AwaitPromotion.
func (s *SentinelSet) KillMaster() (int, error) {
	m, err := s.Master()
	if err != nil {
		return -1, err
	}
	return m, s.Nodes[m].Kill()
}

// AwaitPromotion waits, for at most within, until a majority of the
// sentinels names a master other than node old and that node reports role
// master, and returns its index.
func (s *SentinelSet) AwaitPromotion(old int, within time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	promoted := -1
	err := poll(ctx, nil, func(ctx context.Context) error {
		m, err := s.majorityMaster(ctx)
		if err != nil {
			return err
		}
		if m == old {
			return fmt.Errorf("the sentinels still name node %d", old)
		}
		inf, err := s.info(ctx, m, "replication")
		if err != nil {
			return err
		}
		if inf["role"] != "master" {
			return fmt.Errorf("node %d is named master but is %s", m, inf["role"])
		}
		promoted = m
		return nil
	})
	if err != nil {
		return -1, fmt.Errorf("testserver: no replica promoted within %v: %w", within, err)
	}
	return promoted, nil
}

// StallReplicas makes the replication of master m lag: it stops every
// other node (SIGSTOP) and writes 32 MiB of junk keys to m, more than the
// kernel's socket buffers between m and its replicas hold, so that a write
// m accepts from now on reaches no replica until they are continued. Kill m
// before calling resume, which continues the replicas, to lose those
// writes as an asynchronous failover does. The replicas must be continued
// within about DownAfter, or Sentinel counts them as down too.
func (s *SentinelSet) StallReplicas(m int) (resume func(), err error) {
	resume = func() {
		for i, n := range s.Nodes {
			if i != m {
				_ = n.Resume()
			}
		}
	}
	for i, n := range s.Nodes {
		if i != m {
			if err := n.Pause(); err != nil {
				resume()
				return nil, err
			}
		}
	}
	c := s.Client(m)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	junk := strings.Repeat("j", 1<<20)
	pipe := c.Pipeline()
	for i := range 32 {
		pipe.Set(ctx, "testserver:junk:"+strconv.Itoa(i), junk, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		resume()
		return nil, fmt.Errorf("testserver: stall replicas: fill the replication stream: %w", err)
	}
	return resume, nil
}

// Rejoin restarts node i, empty, as a replica of node master (as an
// operator brings a crashed master back after a failover), and waits until it
// is in sync.
func (s *SentinelSet) Rejoin(i, master int) error {
	s.mu.Lock()
	s.replicaOf[i] = s.Nodes[master].Addr()
	s.mu.Unlock()
	return s.Nodes[i].Restart(true)
}

// Failover kills the master, waits (at most within) until Sentinel promotes
// a replica, brings the killed node back as a replica of the new master and
// waits until the set is steady again (Settle). It returns the old and the
// new master's indexes.
func (s *SentinelSet) Failover(within time.Duration) (old, promoted int, err error) {
	deadline := time.Now().Add(within)
	old, err = s.KillMaster()
	if err != nil {
		return old, -1, err
	}
	promoted, err = s.AwaitPromotion(old, time.Until(deadline))
	if err != nil {
		return old, -1, err
	}
	if err := s.Rejoin(old, promoted); err != nil {
		return old, promoted, err
	}
	return old, promoted, s.Settle(time.Until(deadline))
}

// Stop stops every sentinel and node. It is idempotent.
func (s *SentinelSet) Stop() {
	var wg sync.WaitGroup
	for _, m := range append(append([]*Server{}, s.Sentinels...), s.Nodes...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.Stop()
		}()
	}
	wg.Wait()
}
