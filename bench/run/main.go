// Command run is the one-command launcher of the peer comparison
// (`make bench-peers`): it starts throwaway servers on loopback with
// internal/testserver (one redis-server, three more for Redlock, etcd,
// ZooKeeper, PostgreSQL, MariaDB; an SQLite file in a temporary directory),
// builds the bench/peers module, runs it against them, and stops the servers.
// bench/peers is a module of its own (the peers must never become
// dependencies of dlock) and cannot import an internal package, hence this
// launcher in the main module. Flags after -- go to the peers program.
//
//	go run ./bench/run -only redis,etcd -- -scale 0.3 -out /tmp/peers
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/dlock/dlock/internal/testserver"
)

func main() { os.Exit(run(os.Args[1:])) }

// kinds are the backends, in the order they are started and given.
var kinds = []string{"redis", "redlock", "etcd", "zk", "postgres", "mysql", "sqlite"}

func run(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	only := fs.String("only", strings.Join(kinds, ","), "backends to compare, comma-separated: "+strings.Join(kinds, ","))
	dir := fs.String("peers", "bench/peers", "directory of the bench/peers module")
	if err := fs.Parse(args); err != nil {
		return 64
	}
	want := map[string]bool{}
	for _, k := range strings.Split(*only, ",") {
		k = strings.TrimSpace(k)
		if !contains(kinds, k) {
			fmt.Fprintf(os.Stderr, "run: -only: unknown backend %q (want %s)\n", k, strings.Join(kinds, ","))
			return 64
		}
		want[k] = true
	}
	tmp, err := os.MkdirTemp("", "dlock-bench-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "run: %v\n", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "peers")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir, build.Stdout, build.Stderr = *dir, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "run: building %s: %v\n", *dir, err)
		return 1
	}
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	// The servers die with this process (parent-death signal); the deferred
	// stops handle the normal end, this the interrupt.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	var peerArgs []string
	for _, k := range kinds {
		if !want[k] {
			continue
		}
		fmt.Fprintf(os.Stderr, "run: starting %s\n", k)
		u, stop, err := start(k, tmp)
		if err != nil {
			fmt.Fprintf(os.Stderr, "run: %s: %v\n", k, err)
			return 1
		}
		stops = append(stops, stop)
		peerArgs = append(peerArgs, "-"+k, u)
	}
	cmd := exec.Command(bin, append(peerArgs, fs.Args()...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "run: %v\n", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case s := <-sig:
		_ = cmd.Process.Signal(s)
		err = <-done
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "run: peers: %v\n", err)
		return 1
	}
	return 0
}

// start starts the servers of kind and returns the URL the peers program
// takes for it.
func start(kind, tmp string) (string, func(), error) {
	switch kind {
	case "redis":
		s, err := testserver.StartRedis(nil)
		if err != nil {
			return "", nil, err
		}
		return s.URL(), s.Stop, nil
	case "redlock":
		var hosts []string
		var ss []*testserver.Server
		stop := func() {
			for _, s := range ss {
				s.Stop()
			}
		}
		for range 3 {
			s, err := testserver.StartRedis(nil)
			if err != nil {
				stop()
				return "", nil, err
			}
			ss = append(ss, s)
			hosts = append(hosts, s.Addr())
		}
		return "redlock://" + strings.Join(hosts, ",") + "/0", stop, nil
	case "etcd":
		c, err := testserver.StartEtcd(1)
		if err != nil {
			return "", nil, err
		}
		return c.URL(), c.Stop, nil
	case "zk":
		c, err := testserver.StartZooKeeper(1)
		if err != nil {
			return "", nil, err
		}
		return c.URL(), c.Stop, nil
	case "postgres":
		s, err := testserver.StartPostgres(nil)
		if err != nil {
			return "", nil, err
		}
		return s.URL(), s.Stop, nil
	case "mysql":
		s, err := testserver.StartMariaDB(nil)
		if err != nil {
			return "", nil, err
		}
		return s.URL(), s.Stop, nil
	default: // sqlite
		return "sqlite://" + filepath.Join(tmp, "locks.db"), func() {}, nil
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
