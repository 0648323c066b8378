package check

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock/mysqllock"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

// injectFaults runs the configured faults in turn until ctx ends: a warm-up
// first, then each fault followed by a recovery gap, so that the run has
// stretches without faults in which liveness is judged.
func (r *runner) injectFaults(ctx context.Context) {
	faults := r.cfg.Faults
	if len(faults) == 0 {
		return
	}
	ttl := r.cfg.TTL
	pause(ctx, min(r.cfg.Duration/5, 2*time.Second))
	for i := 0; ctx.Err() == nil; i++ {
		f := faults[i%len(faults)]
		// A fault needs time to act and the system time to recover
		// before the run ends.
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < r.faultSpan(f) {
			return
		}
		r.inject(ctx, f)
		pause(ctx, ttl+r.cfg.LockDelay+time.Duration(rand.Int64N(int64(ttl))))
	}
}

// faultSpan is about how long one injection of f lasts.
func (r *runner) faultSpan(f string) time.Duration {
	ttl := r.cfg.TTL
	switch f {
	case FaultRestartServer, FaultRestartWiped, FaultKillLeader, FaultFailoverMaster:
		return ttl + 2*time.Second
	default:
		return r.faultHold() + ttl/2
	}
}

// faultHold is how long a pause, partition or slow network lasts: well
// past the TTL (and lock-delay), so that leases run out during it.
func (r *runner) faultHold() time.Duration {
	return 3*r.cfg.TTL/2 + r.cfg.LockDelay
}

// mark records a fault's start or end.
func (r *runner) mark(k Kind, fault, target string, errText string) {
	ev := stamp(k)
	ev.Worker, ev.Goroutine, ev.Fault, ev.Target, ev.Err = -1, -1, fault, target, errText
	r.record(ev)
}

// waitHolder waits up to limit for a worker (among candidates, or any when
// nil) to hold a lock, and returns it; -1 if none did.
func (r *runner) waitHolder(ctx context.Context, candidates []int, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		for _, w := range r.holders() {
			if (candidates == nil || contains(candidates, w)) && r.alive(w) {
				return w
			}
		}
		pause(ctx, 5*time.Millisecond) // polling for a holder, bounded by limit
	}
	return -1
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// proc returns worker w's process, nil if it has exited or was killed.
func (r *runner) proc(w int) *workerProc {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.workers {
		if p.index == w && !p.killed {
			select {
			case <-p.done:
				return nil
			default:
				return p
			}
		}
	}
	return nil
}

func (r *runner) alive(w int) bool { return r.proc(w) != nil }

// inject runs one fault to its end. Whatever happens to ctx, a fault that
// started is undone (a stopped process continued, a partition healed, a
// killed server restarted), since the run's servers and workers must be
// usable at the end.
func (r *runner) inject(ctx context.Context, f string) {
	ttl := r.cfg.TTL
	hold := r.faultHold()
	switch f {
	case FaultPauseHolder:
		w := r.waitHolder(ctx, nil, 2*ttl)
		p := r.proc(w)
		if p == nil {
			return
		}
		target := fmt.Sprintf("worker %d", w)
		r.mark(KindFaultStart, f, target, "")
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		pause(context.Background(), hold) // the fault itself: stopped for longer than the TTL
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		r.mark(KindFaultEnd, f, target, "")
	case FaultKillHolder:
		w := r.waitHolder(ctx, nil, 2*ttl)
		p := r.proc(w)
		if p == nil {
			return
		}
		target := fmt.Sprintf("worker %d", w)
		r.mark(KindFaultStart, f, target, "")
		r.mu.Lock()
		p.killed = true
		next := len(r.workers)
		r.mu.Unlock()
		_ = p.cmd.Process.Kill()
		<-p.done
		r.forget(w)
		r.mark(KindFaultEnd, f, target, "")
		if err := r.startWorker(next); err != nil {
			r.mark(KindFaultEnd, f, fmt.Sprintf("replacement worker %d", next), err.Error())
		}
	case FaultPartition, FaultLatency:
		r.waitHolder(ctx, []int{0}, 2*ttl) // best when worker 0 holds
		target := "worker 0"
		r.mark(KindFaultStart, f, target, "")
		for _, p := range r.proxies {
			if f == FaultPartition {
				p.Partition()
			} else {
				p.SetDelay(ttl / 4)
			}
		}
		pause(context.Background(), hold)
		for _, p := range r.proxies {
			p.Heal()
			p.SetDelay(0)
		}
		r.mark(KindFaultEnd, f, target, "")
	default:
		r.serverFault(ctx, f)
	}
}

// serverFault injects a fault into the servers the checker started.
func (r *runner) serverFault(ctx context.Context, f string) {
	s := r.servers
	ttl := r.cfg.TTL
	r.waitHolder(ctx, nil, 2*ttl) // faults matter most while someone holds
	switch f {
	case FaultRestartServer, FaultRestartWiped, FaultPauseServer, FaultKillLeader:
		i, m, err := s.member()
		if f != FaultKillLeader && len(s.members) > 1 && (s.kind == "redlock" || s.kind == "quorum") {
			i = rand.IntN(len(s.members))
			m = s.members[i]
		}
		target := fmt.Sprintf("server %d", i)
		if f == FaultKillLeader {
			target = fmt.Sprintf("leader (server %d)", i)
		}
		if err != nil {
			r.mark(KindFaultStart, f, "server", "")
			r.mark(KindFaultEnd, f, "server", err.Error())
			return
		}
		r.mark(KindFaultStart, f, target, "")
		var ferr error
		switch f {
		case FaultPauseServer:
			ferr = m.Pause()
			pause(context.Background(), r.faultHold()) // the fault itself
			if err := m.Resume(); ferr == nil {
				ferr = err
			}
		case FaultRestartWiped:
			if ferr = m.Kill(); ferr == nil {
				if s.kind == "redlock" || s.kind == "quorum" {
					// The documented delayed restart (Redlock's, and
					// quorum's on Redis nodes): a node that lost its data
					// stays out for longer than a TTL.
					pause(context.Background(), ttl+r.cfg.LockDelay+200*time.Millisecond)
				}
				ferr = m.Restart(true)
			}
		default:
			if ferr = m.Kill(); ferr == nil {
				pause(context.Background(), ttl/2) // down for a while
				ferr = m.Restart(false)
			}
		}
		r.mark(KindFaultEnd, f, target, errText(ferr))
	case FaultClockJump:
		i, m, err := s.member()
		if err != nil {
			return
		}
		jump := 5 * ttl
		target := fmt.Sprintf("server %d clock +%v", i, jump)
		r.mark(KindFaultStart, f, target, "")
		r.mu.Lock()
		r.clockOff += jump
		off := r.clockOff
		r.mu.Unlock()
		ferr := m.SetClockOffset(off)
		pause(context.Background(), ttl) // leave the jump time to act before calling it over
		r.mark(KindFaultEnd, f, target, errText(ferr))
	case FaultKillSession:
		r.killSession(ctx)
	case FaultFailoverMaster:
		r.failoverMaster(ctx)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// resetClock puts every server's clock back after a run that jumped it.
func (s *Servers) resetClock() {
	if !s.faketime {
		return
	}
	for _, m := range s.members {
		_ = m.SetClockOffset(0)
	}
}

// killSession ends a lock holder's SQL session on the server:
// pg_terminate_backend on a backend holding an advisory lock or an open
// row-lock transaction; KILL on a MariaDB connection holding GET_LOCK or an
// InnoDB transaction. The fault starts before the kill is sent.
func (r *runner) killSession(ctx context.Context) {
	s := r.servers
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var k sessionKiller
	var err error
	switch s.kind {
	case "postgres":
		k, err = r.postgresKiller(ctx)
	case "mysql":
		k, err = r.mysqlKiller(ctx)
	}
	if err != nil {
		r.mark(KindFaultStart, FaultKillSession, "session", "")
		r.mark(KindFaultEnd, FaultKillSession, "session", err.Error())
		return
	}
	defer k.close()
	victim, err := k.find(ctx)
	if victim == "" && err == nil {
		return // nobody held a session lock just then
	}
	target := "session " + victim
	r.mark(KindFaultStart, FaultKillSession, target, "")
	if err == nil {
		err = k.kill(ctx, victim)
	}
	r.mark(KindFaultEnd, FaultKillSession, target, errText(err))
}

// sessionKiller finds a lock holder's session and kills it.
type sessionKiller struct {
	find  func(ctx context.Context) (string, error) // "" when nobody holds
	kill  func(ctx context.Context, victim string) error
	close func()
}

// pollVictim runs find until it names a session or 2×TTL have passed.
func (r *runner) pollVictim(ctx context.Context, find func() (string, error)) (string, error) {
	deadline := time.Now().Add(2 * r.cfg.TTL)
	for {
		v, err := find()
		if v != "" || err != nil || time.Now().After(deadline) || ctx.Err() != nil {
			return v, err
		}
		pause(ctx, 10*time.Millisecond) // polling for a holder, bounded by deadline
	}
}

func (r *runner) postgresKiller(ctx context.Context) (sessionKiller, error) {
	conn, err := pgx.Connect(ctx, r.servers.members[0].URL())
	if err != nil {
		return sessionKiller{}, err
	}
	q := `SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database() AND pid <> pg_backend_pid()`
	if r.servers.mode == "advisory" {
		q = `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()`
	}
	q += ` ORDER BY random() LIMIT 1`
	return sessionKiller{
		find: func(ctx context.Context) (string, error) {
			return r.pollVictim(ctx, func() (string, error) {
				var pid int
				err := conn.QueryRow(ctx, q).Scan(&pid)
				if errors.Is(err, pgx.ErrNoRows) {
					return "", nil
				}
				if err != nil {
					return "", err
				}
				return "pid " + strconv.Itoa(pid), nil
			})
		},
		kill: func(ctx context.Context, victim string) error {
			pid, _ := strconv.Atoi(strings.TrimPrefix(victim, "pid "))
			_, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
			return err
		},
		close: func() { conn.Close(context.Background()) },
	}, nil
}

func (r *runner) mysqlKiller(ctx context.Context) (sessionKiller, error) {
	db, err := sql.Open("mysql", r.servers.members[0].DSN())
	if err != nil {
		return sessionKiller{}, err
	}
	q := "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id <> CONNECTION_ID()"
	var args []any
	if r.servers.mode == "getlock" {
		var parts []string
		for _, l := range r.locks {
			parts = append(parts, "SELECT IS_USED_LOCK(?) AS id")
			args = append(args, mysqllock.LockName(l))
		}
		q = "SELECT id FROM (" + strings.Join(parts, " UNION ALL ") + ") t WHERE id IS NOT NULL"
	}
	q += " ORDER BY RAND() LIMIT 1"
	return sessionKiller{
		find: func(ctx context.Context) (string, error) {
			return r.pollVictim(ctx, func() (string, error) {
				var id int64
				err := db.QueryRowContext(ctx, q, args...).Scan(&id)
				if errors.Is(err, sql.ErrNoRows) {
					return "", nil
				}
				if err != nil {
					return "", err
				}
				return "connection " + strconv.FormatInt(id, 10), nil
			})
		},
		kill: func(ctx context.Context, victim string) error {
			id, _ := strconv.ParseInt(strings.TrimPrefix(victim, "connection "), 10, 64)
			_, err := db.ExecContext(ctx, "KILL "+strconv.FormatInt(id, 10))
			return err
		},
		close: func() { db.Close() },
	}, nil
}
