// Command dlock runs a command while holding a distributed lock, and shows
// which locks are held. See docs/cli.md, or run "dlock help run".
//
// It reaches every backend dlock has a driver for; the drivers are imported
// here for their URL schemes. With no --url and no $DLOCK_URL it uses an
// SQLite file in the user's state directory, so it works on a fresh machine.
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	_ "github.com/dlock/dlock/etcdlock"
	_ "github.com/dlock/dlock/memlock"
	_ "github.com/dlock/dlock/mysqllock"
	_ "github.com/dlock/dlock/pglock"
	_ "github.com/dlock/dlock/quorum"
	_ "github.com/dlock/dlock/redislock"
	_ "github.com/dlock/dlock/redlock"
	_ "github.com/dlock/dlock/sqlitelock"
	_ "github.com/dlock/dlock/zklock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

func main() {
	// go-redis logs dial failures to stderr on its own; dlock reports the
	// error that matters once, in its own words.
	redis.SetLogger(&logging.VoidLogger{})
	os.Exit(run(os.Args[1:], processEnv()))
}

// env is everything a command takes from its process, so that tests can run
// commands in-process with their own streams, environment and signals.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// lookupEnv reads an environment variable (os.LookupEnv).
	lookupEnv func(key string) (string, bool)
	// environ is the environment handed to a child (os.Environ).
	environ func() []string
	// notify starts delivering handledSignals on the returned channel until
	// stop is called.
	notify func() (sigs <-chan os.Signal, stop func())

	// secrets are strings (URL passwords) that must never be printed; see
	// addSecrets and scrub.
	secrets []string

	// log receives dlock's diagnostics and the library's (see setupLog);
	// logJSON is set for --log-format json, verbose for -v.
	log     *slog.Logger
	logJSON bool
	verbose bool
}

// processEnv is the env of the running process.
func processEnv() *env {
	return &env{
		stdin:     os.Stdin,
		stdout:    os.Stdout,
		stderr:    os.Stderr,
		lookupEnv: os.LookupEnv,
		environ:   os.Environ,
		notify: func() (<-chan os.Signal, func()) {
			c := make(chan os.Signal, 4)
			for _, s := range handledSignals {
				// A signal dlock was started with ignored (nohup's SIGHUP, a
				// script's "&" job's SIGINT) stays ignored: Notify would
				// undo that. CMD inherits it ignored too.
				if !signal.Ignored(s) {
					signal.Notify(c, s)
				}
			}
			return c, func() { signal.Stop(c) }
		},
	}
}

// handledSignals are the signals "dlock run" catches: SIGINT, SIGTERM and
// SIGHUP are passed on to the child; SIGTSTP and SIGCONT carry job control
// (Ctrl-Z, fg) over to the child's process group.
var handledSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGTSTP, syscall.SIGCONT}

// getenv returns the variable's value, "" when unset.
func (e *env) getenv(key string) string {
	v, _ := e.lookupEnv(key)
	return v
}

// warnf prints one line on stderr, with secrets masked; with --log-format
// json, a WARN record instead.
func (e *env) warnf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if e.logJSON {
		e.logger().Warn(msg)
		return
	}
	fmt.Fprintln(e.stderr, e.scrub(msg))
}

// errorf is warnf for the error dlock exits with: an ERROR record with
// --log-format json.
func (e *env) errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if e.logJSON {
		e.logger().Error(msg)
		return
	}
	fmt.Fprintln(e.stderr, e.scrub(msg))
}
