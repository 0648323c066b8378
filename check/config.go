package check

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Config describes one checker run. The zero value of every field but URL
// or Spawn takes the default named in its comment.
type Config struct {
	// URL is the backend the workers lock through (any scheme dlock.Open
	// takes). Exactly one of URL and Spawn is set.
	URL string
	// Spawn names a backend the checker starts itself, on loopback, from
	// the programs internal/testserver knows: one of Kinds ("redis",
	// "redlock", "quorum" (3 Redis nodes), "etcd", "zk", "postgres",
	// "mysql", "sqlite", "redis-sentinel"), optionally with a mode after a slash for the SQL
	// backends ("postgres/advisory", "mysql/getlock") and for
	// redis-sentinel ("redis-sentinel/wait", the default: min_replicas=1;
	// "redis-sentinel/async": no WAIT). Server-side faults need it.
	Spawn string
	// Faults are injected in turn, over and over, for the whole run (after
	// a warm-up), each from the Fault* constants. Empty or FaultNone: none.
	Faults []string
	// Workers is the number of worker processes (default 3); Goroutines
	// the number of contending goroutines in each (default 3); Locks the
	// number of lock names they share (default 2).
	Workers, Goroutines, Locks int
	// Duration is how long the workload runs (default 20s).
	Duration time.Duration
	// TTL is the lease TTL the workers ask for (default 1s; 2s for etcd
	// and ZooKeeper, whose sessions cannot be shorter).
	TTL time.Duration
	// LockDelay is the lock-delay the workers ask for (default 0; the SQL
	// session modes refuse any).
	LockDelay time.Duration
	// HoldMin and HoldMax bound the random time a critical section lasts
	// (defaults 2ms and 60ms).
	HoldMin, HoldMax time.Duration
	// WorkerCommand starts one worker process: the program and its
	// arguments. The checker adds the worker's settings to its environment
	// (WorkerEnv); the program must then call WorkerMain. Default: this
	// executable with the argument "check-worker" (dlock's hidden
	// subcommand). Tests pass the test binary, whose TestMain calls
	// WorkerMain when WorkerEnv is set.
	WorkerCommand []string
	// Servers, with Spawn, are servers started beforehand by StartServers
	// for that backend, used instead of starting new ones (and not stopped
	// by Run). Nil: Run starts and stops its own.
	Servers *Servers
	// Progress, if not nil, receives a status line about once a second
	// (each starting with "\r", for a terminal).
	Progress func(line string)
}

// ErrBadConfig is wrapped by the errors Run and StartServers return for a
// Config that cannot work (bad input, as opposed to a failure while running).
var ErrBadConfig = errors.New("check: bad configuration")

type badConfig struct{ err error }

func (e badConfig) Error() string   { return e.err.Error() }
func (e badConfig) Unwrap() []error { return []error{ErrBadConfig, e.err} }

// Kinds lists the backends Spawn can start.
var Kinds = []string{"sqlite", "redis", "redlock", "quorum", "etcd", "zk", "postgres", "mysql", "redis-sentinel"}

// Faults lists every fault name, FaultNone first.
var Faults = []string{FaultNone, FaultPauseHolder, FaultKillHolder, FaultPartition, FaultLatency,
	FaultRestartServer, FaultRestartWiped, FaultPauseServer, FaultKillLeader, FaultClockJump, FaultKillSession,
	FaultFailoverMaster}

// sqlModes are the lock modes of the SQL backends, the default first, and
// the replication modes of redis-sentinel (see sentinelMode).
var sqlModes = map[string][]string{
	"postgres":       {"lease", "advisory", "rowlock"},
	"mysql":          {"lease", "getlock", "rowlock"},
	"redis-sentinel": {"wait", "async"},
}

// Applies reports whether fault can be injected into a run on backend,
// a backend kind as Spawn takes it ("postgres/advisory"), a URL scheme for
// runs on a URL ("redis", "checkbroken"), and whether the servers are the
// checker's own (spawned). The error says why not.
func Applies(backend, fault string, spawned bool) error {
	kind, mode, _ := strings.Cut(backend, "/")
	if !slices.Contains(Faults, fault) {
		return fmt.Errorf("unknown fault %q (known: %s)", fault, strings.Join(Faults, ", "))
	}
	network := kind != "sqlite" && kind != "checkbroken" && kind != "mem"
	if err := sentinelApplies(kind, fault); err != nil {
		return err
	}
	switch fault {
	case FaultNone, FaultPauseHolder, FaultKillHolder:
		return nil
	case FaultPartition, FaultLatency:
		if !network {
			return fmt.Errorf("fault %s does not apply to %s: it has no network to cut or slow", fault, kind)
		}
		return nil
	}
	if !spawned {
		return fmt.Errorf("fault %s needs servers the checker starts itself (--spawn)", fault)
	}
	ok := false
	why := ""
	switch fault {
	case FaultRestartServer, FaultPauseServer:
		ok, why = network, "it has no server"
	case FaultRestartWiped:
		ok, why = kind == "redis" || kind == "redlock" || kind == "quorum", "only Redis runs without persistence"
	case FaultKillLeader:
		ok, why = kind == "etcd" || kind == "zk", "only etcd and ZooKeeper have a leader (the checker starts 3 members)"
	case FaultClockJump:
		ok, why = kind == "redis" || kind == "redlock" || kind == "quorum" || kind == "postgres" || kind == "mysql", "its server cannot run under libfaketime here"
	case FaultFailoverMaster:
		ok, why = kind == "redis-sentinel", "only redis-sentinel has a master that Sentinel replaces"
	case FaultKillSession:
		ok = (kind == "postgres" && (mode == "advisory" || mode == "rowlock")) || (kind == "mysql" && (mode == "getlock" || mode == "rowlock"))
		why = "only the SQL session modes (postgres advisory/rowlock, mysql getlock/rowlock) hold a session"
	}
	if !ok {
		return fmt.Errorf("fault %s does not apply to %s: %s", fault, backend, why)
	}
	return nil
}

// defaults fills in zero fields and checks the rest; its errors wrap
// ErrBadConfig.
func (c *Config) defaults() error {
	if err := c.fill(); err != nil {
		return badConfig{err}
	}
	return nil
}

func (c *Config) fill() error {
	if (c.URL == "") == (c.Spawn == "") {
		return errors.New("check: give exactly one of a URL and a backend to spawn")
	}
	if c.Spawn != "" {
		kind, mode, hasMode := strings.Cut(c.Spawn, "/")
		if !slices.Contains(Kinds, kind) {
			return fmt.Errorf("check: cannot spawn %q (known: %s)", c.Spawn, strings.Join(Kinds, ", "))
		}
		modes := sqlModes[kind]
		switch {
		case hasMode && modes == nil:
			return fmt.Errorf("check: %s has no modes (%q)", kind, c.Spawn)
		case hasMode && !slices.Contains(modes, mode):
			return fmt.Errorf("check: unknown %s mode %q (known: %s)", kind, mode, strings.Join(modes, ", "))
		case !hasMode && modes != nil:
			c.Spawn = kind + "/" + modes[0]
		}
	} else {
		u, err := url.Parse(c.URL)
		if err != nil || u.Scheme == "" {
			return errors.New("check: the URL cannot be parsed (want scheme://host/path?params)")
		}
		if u.Scheme == "mem" {
			return errors.New("check: mem:// locks live inside one process, and the checker's workers are separate processes")
		}
	}
	if c.Workers == 0 {
		c.Workers = 3
	}
	if c.Goroutines == 0 {
		c.Goroutines = 3
	}
	if c.Locks == 0 {
		c.Locks = 2
	}
	if c.Duration == 0 {
		c.Duration = 20 * time.Second
	}
	kind := c.kind()
	if c.TTL == 0 {
		c.TTL = time.Second
		if kind == "etcd" || kind == "zk" {
			c.TTL = 2 * time.Second
		}
	}
	if c.HoldMin == 0 {
		c.HoldMin = 2 * time.Millisecond
	}
	if c.HoldMax == 0 {
		c.HoldMax = 60 * time.Millisecond
	}
	switch {
	case c.Workers < 1 || c.Workers > 64:
		return fmt.Errorf("check: workers must be 1 to 64, got %d", c.Workers)
	case c.Goroutines < 1 || c.Goroutines > 256:
		return fmt.Errorf("check: goroutines must be 1 to 256, got %d", c.Goroutines)
	case c.Locks < 1 || c.Locks > 1000:
		return fmt.Errorf("check: locks must be 1 to 1000, got %d", c.Locks)
	case c.Duration < time.Second || c.Duration > 24*time.Hour:
		return fmt.Errorf("check: duration must be 1s to 24h, got %v", c.Duration)
	case c.TTL < 100*time.Millisecond || c.TTL > time.Hour:
		return fmt.Errorf("check: ttl must be 100ms to 1h, got %v", c.TTL)
	case c.LockDelay < 0 || c.LockDelay > time.Hour:
		return fmt.Errorf("check: lock-delay must be 0 to 1h, got %v", c.LockDelay)
	case c.HoldMin < 0 || c.HoldMax < c.HoldMin || c.HoldMax >= c.TTL:
		return fmt.Errorf("check: hold times must satisfy 0 ≤ min (%v) ≤ max (%v) < ttl (%v)", c.HoldMin, c.HoldMax, c.TTL)
	}
	var faults []string
	for _, f := range c.Faults {
		if f == FaultNone || slices.Contains(faults, f) {
			continue
		}
		if err := Applies(c.backendKind(), f, c.Spawn != ""); err != nil {
			return fmt.Errorf("check: %w", err)
		}
		faults = append(faults, f)
	}
	c.Faults = faults
	return nil
}

// kind is the backend kind: the spawn kind, or the URL's scheme.
func (c *Config) kind() string {
	if c.Spawn != "" {
		k, _, _ := strings.Cut(c.Spawn, "/")
		return k
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return ""
	}
	switch s := u.Scheme; s {
	case "rediss":
		return "redis"
	case "postgresql":
		return "postgres"
	default:
		return s
	}
}

// backendKind is kind plus the SQL mode ("postgres/advisory").
func (c *Config) backendKind() string {
	if c.Spawn != "" {
		return c.Spawn
	}
	k := c.kind()
	if k == "redis-sentinel" {
		return k + "/" + sentinelMode(c.URL)
	}
	if sqlModes[k] != nil {
		mode := sqlModes[k][0]
		if u, err := url.Parse(c.URL); err == nil && u.Query().Get("mode") != "" {
			mode = u.Query().Get("mode")
		}
		return k + "/" + mode
	}
	if k == "checkbroken" {
		if u, err := url.Parse(c.URL); err == nil {
			return k + "/" + u.Query().Get("mode")
		}
	}
	return k
}
