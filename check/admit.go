package check

import (
	"net/url"
	"strings"
)

// admission is one (backends, fault, classes) combination that
// docs/backends.md admits, with the reason the report prints.
type admission struct {
	backends []string // "kind" or "kind/mode"
	fault    string
	classes  []string
	why      string
}

// The admitted combinations. Keep this list minimal and in step with the
// section "What the checker admits" of docs/backends.md: an entry is a promise
// dlock does not make.
var admissions = []admission{
	{
		backends: []string{"redis", "redlock", "sqlite", "postgres", "mysql"},
		fault:    FaultRestartWiped,
		classes:  []string{ClassValidityOverlap, ClassUnsafeWrite, ClassTokenOrder, ClassDuplicateToken},
		why:      "a store restarted without its data forgets every lock and every fencing counter (for redlock: a node that rejoins at once instead of after a delayed restart)",
	},
	{
		backends: []string{"redis", "sqlite", "postgres/lease", "mysql/lease"},
		fault:    FaultClockJump,
		classes:  []string{ClassValidityOverlap, ClassUnsafeWrite},
		why:      "expiry is decided by the server's wall clock; a forward jump expires a lease its holder still believes valid (tokens still increase)",
	},
	{
		backends: []string{"redlock"},
		fault:    FaultClockJump,
		classes:  []string{ClassValidityOverlap, ClassUnsafeWrite, ClassTokenOrder, ClassDuplicateToken},
		why:      "Redlock's safety assumes node clocks advance at the client's rate; a jump breaks exclusion and token order",
	},
	{
		backends: []string{"quorum"},
		fault:    FaultClockJump,
		classes:  []string{ClassValidityOverlap, ClassUnsafeWrite},
		why:      "a quorum's leases expire by each node's clock, assumed to advance at the client's rate: a forward jump frees a node of a live lease, which with a node the holder did not get makes a second majority (tokens still increase: every majority shares a node that had the token)",
	},
	{
		backends: []string{"redis-sentinel/async"},
		fault:    FaultFailoverMaster,
		classes:  []string{ClassValidityOverlap, ClassUnsafeWrite, ClassTokenOrder, ClassDuplicateToken},
		why:      "Redis replicates asynchronously: grants (and fencing counter increments) the master acknowledged before any replica had them are lost when Sentinel promotes a replica (min_replicas refuses such grants)",
	},
	{
		backends: []string{"postgres/advisory", "postgres/rowlock", "mysql/getlock", "mysql/rowlock"},
		fault:    FaultKillSession,
		classes:  []string{ClassValidityOverlap, ClassUnsafeWrite},
		why:      "killing the holder's session frees its lock at once; the holder learns at its next renewal ping (the fence still refuses it)",
	},
	{
		backends: []string{"postgres/advisory", "postgres/rowlock", "mysql/getlock", "mysql/rowlock"},
		fault:    FaultRestartServer,
		classes:  []string{ClassValidityOverlap, ClassUnsafeWrite},
		why:      "session locks die with the server's sessions; holders learn at their next renewal ping (the fence still refuses them)",
	},
}

// defaultModes are the modes of SQL URLs without mode=.
var defaultModes = map[string]string{"postgres": "lease", "mysql": "lease"}

// backendKind splits a History.Backend ("kind" or "kind/mode", with the
// mode possibly only in the URL's mode= parameter) into kind and mode.
func backendKind(backend, rawURL string) (kind, mode string) {
	kind, mode, _ = strings.Cut(strings.ToLower(strings.TrimSpace(backend)), "/")
	switch kind {
	case "postgresql", "pg", "pglock":
		kind = "postgres"
	case "mariadb", "mysqllock":
		kind = "mysql"
	case "rediss", "redislock":
		kind = "redis"
	case "etcdlock":
		kind = "etcd"
	case "zookeeper", "zklock":
		kind = "zk"
	case "sqlitelock":
		kind = "sqlite"
	}
	if mode == "" {
		if u, err := url.Parse(rawURL); err == nil {
			mode = strings.ToLower(u.Query().Get("mode"))
		}
	}
	if mode == "" {
		mode = defaultModes[kind]
	}
	return kind, mode
}

// Admission reports whether docs/backends.md admits a violation of class
// under fault on the given backend (History.Backend: "redis", "postgres",
// "postgres/advisory", …; the SQL mode may instead come from url's mode=
// parameter, and defaults to lease), and why. Analyze admits a violation only
// when, in addition, it touches a window of that fault (from the fault's
// start to its end plus FaultRecovery). Liveness, late-unlock, leak and panic
// are never admitted.
func Admission(backend, url, fault, class string) (why string, ok bool) {
	kind, mode := backendKind(backend, url)
	for _, a := range admissions {
		if a.fault != fault {
			continue
		}
		match := false
		for _, b := range a.backends {
			if b == kind || b == kind+"/"+mode {
				match = true
				break
			}
		}
		if !match {
			continue
		}
		for _, c := range a.classes {
			if c == class {
				return a.why, true
			}
		}
	}
	return "", false
}
