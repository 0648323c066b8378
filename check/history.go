package check

import (
	"time"
)

// Kind names what an Event records.
type Kind string

// The kinds of event a run records. Workers log the lock-side events; the
// coordinator logs faults and the fenced resource logs every write attempt.
const (
	// KindRequest: a Lock call was sent (Op identifies the attempt).
	KindRequest Kind = "request"
	// KindGrant: Lock returned a lease. Token and ValidUntil are set.
	KindGrant Kind = "grant"
	// KindAcquireError: Lock returned an error (Err is set); no lease.
	KindAcquireError Kind = "acquire_error"
	// KindValid: the holder read its lease's validity (ValidUntil set), for
	// example right before a critical-section write. A lease is believed
	// valid by its holder up to the latest ValidUntil it read, unless Done
	// closed or Unlock started earlier.
	KindValid Kind = "valid"
	// KindDone: the lease's Done channel closed (Err holds Lease.Err()).
	KindDone Kind = "done"
	// KindWrite: a critical-section write reached the fenced resource.
	// Token is the writer's token, Accepted says whether the resource took
	// it (token ≥ the highest it had seen for Lock), ValidUntil is the
	// writer's own validity deadline read just before the write.
	KindWrite Kind = "write"
	// KindUnlockStart and KindUnlockEnd bracket a Lease.Unlock call; Err on
	// the end event is its result ("" for nil).
	KindUnlockStart Kind = "unlock_start"
	KindUnlockEnd   Kind = "unlock_end"
	// KindFaultStart and KindFaultEnd bracket an injected fault; Fault names
	// it and Target what it hit ("worker 2", "server 1", "leader").
	KindFaultStart Kind = "fault_start"
	KindFaultEnd   Kind = "fault_end"
	// KindPanic: a worker panicked or exited abnormally (Err has the
	// evidence).
	KindPanic Kind = "panic"
	// KindLeak: after Client.Close a worker still had goroutines or
	// connections it did not have before Open (Err says which).
	KindLeak Kind = "leak"
)

// Event is one line of a run's history. Times are read from the machine's
// monotonic clock (CLOCK_MONOTONIC, shared by every process on the machine,
// so events of different workers compare directly) and from the wall clock.
type Event struct {
	Kind Kind `json:"kind"`
	// Mono is CLOCK_MONOTONIC in nanoseconds when the event happened.
	Mono int64 `json:"mono"`
	// Wall is the wall-clock time, for people.
	Wall time.Time `json:"wall"`
	// Worker is the worker process's index (0-based); -1 for the
	// coordinator (faults) and the fenced resource when no worker applies.
	Worker int `json:"worker"`
	// Goroutine is the goroutine's index within its worker.
	Goroutine int `json:"goroutine"`
	// Lock is the lock's name.
	Lock string `json:"lock,omitempty"`
	// Op identifies one Lock attempt of one goroutine of one worker, from
	// request to unlock: (Worker, Goroutine, Op) is unique in a run.
	Op int64 `json:"op,omitempty"`
	// Token is the fencing token (grant, write).
	Token uint64 `json:"token,omitempty"`
	// ValidUntil is the lease's local validity deadline on the Mono clock
	// (grant, valid, write); 0 when not known.
	ValidUntil int64 `json:"valid_until,omitempty"`
	// Accepted is the fenced resource's answer to a write.
	Accepted bool `json:"accepted,omitempty"`
	// Err is an error text ("" for none).
	Err string `json:"err,omitempty"`
	// Fault and Target describe a fault event.
	Fault  string `json:"fault,omitempty"`
	Target string `json:"target,omitempty"`
}

// History is everything one run recorded, sorted by Mono.
type History struct {
	// Backend is the backend kind ("redis", "etcd", "postgres", …) and URL
	// the workers used, with any password removed.
	Backend string `json:"backend"`
	URL     string `json:"url"`
	// TTL and LockDelay are the lease options the workers used.
	TTL       time.Duration `json:"ttl"`
	LockDelay time.Duration `json:"lock_delay"`
	// Workers, Goroutines and Locks describe the workload.
	Workers    int      `json:"workers"`
	Goroutines int      `json:"goroutines"`
	Locks      []string `json:"locks"`
	// Start and End bound the run on the Mono clock.
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	// Stop is when the coordinator began stopping the workers (Mono; 0 if
	// not recorded). Analyze judges liveness only before Stop: while
	// workers close, waiters may be left without a holder and without
	// events.
	Stop int64 `json:"stop,omitempty"`
	// Faults are the fault names the run injected (see KindFaultStart).
	Faults []string `json:"faults"`
	Events []Event  `json:"events"`
}

// Fault names, as `dlock check --fault` takes them and History.Faults and
// fault events record them. Client-side faults apply on any URL; the others
// need servers the checker started itself (--spawn).
const (
	// FaultNone injects nothing (a baseline run).
	FaultNone = "none"
	// FaultPauseHolder SIGSTOPs a worker while it holds a lock, for longer
	// than the TTL, then SIGCONTs it.
	FaultPauseHolder = "pause-holder"
	// FaultKillHolder SIGKILLs a worker while it holds a lock (the
	// coordinator starts a replacement worker).
	FaultKillHolder = "kill-holder"
	// FaultPartition cuts one worker off from the servers (through the
	// checker's TCP proxy) for longer than the TTL, then heals it.
	FaultPartition = "partition"
	// FaultLatency adds latency to one worker's traffic through the proxy.
	FaultLatency = "latency"
	// FaultRestartServer kills a server and restarts it with its data kept.
	FaultRestartServer = "restart-server"
	// FaultRestartWiped kills a server and restarts it with its data gone
	// (Redis without persistence): violations are expected and admitted.
	FaultRestartWiped = "restart-wiped"
	// FaultPauseServer SIGSTOPs a server for a while, then SIGCONTs it.
	FaultPauseServer = "pause-server"
	// FaultKillLeader kills the leader of a 3-member etcd cluster or
	// ZooKeeper ensemble and restarts it.
	FaultKillLeader = "kill-leader"
	// FaultClockJump moves a server's clock forward (libfaketime).
	FaultClockJump = "clock-jump"
	// FaultKillSession kills the holder's SQL session on the server
	// (pg_terminate_backend, KILL).
	FaultKillSession = "kill-session"
	// FaultFailoverMaster kills the master of a Sentinel-managed Redis
	// (redis-sentinel) while its replicas lag (stopped, the replication
	// stream filled), so that its last grants reach no replica, and lets
	// Sentinel promote a replica; the old master rejoins as a replica.
	FaultFailoverMaster = "failover-master"
)
