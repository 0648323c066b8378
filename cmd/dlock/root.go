package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// run executes dlock with args (without the program name) and returns the
// process's exit code. Errors are printed to e.stderr on one line.
func run(args []string, e *env) int {
	root := newRootCmd(e)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			e.errorf("%s", message(ee.err))
		}
		return ee.code
	}
	// Anything else comes from cobra: an unknown command, a bad flag or a
	// wrong number of arguments.
	e.errorf("%s", message(err))
	e.warnf("Run 'dlock help' for usage.")
	return exitUsage
}

// newRootCmd builds the dlock command tree. Nothing is kept in package
// variables: every flag lives in the command that newXCmd builds.
func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "dlock",
		Short: "Run commands under a distributed lock",
		Long: `dlock runs a command while holding a named distributed lock, with a fencing
token, lease renewal, and the child stopped if the lease is lost.

The backend is chosen by URL: --url or --url-file FILE, else $DLOCK_URL or
$DLOCK_URL_FILE, else an SQLite file in $XDG_STATE_HOME/dlock/locks.db
(default ~/.local/state/dlock/locks.db), created on first use. A password in
--url is visible to other users in ps: give it in a file of mode 0600 with
--url-file. Supported schemes: ` + schemeList() + `.`,
		Version:       readBuildVersion().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		// With no subcommand, show help rather than doing nothing.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	// "dlock completion bash|zsh|fish|powershell" is cobra's own.
	root.CompletionOptions.HiddenDefaultCmd = false
	root.SetVersionTemplate("{{.Version}}\n")
	var (
		verbose   bool
		logFormat string
	)
	pf := root.PersistentFlags()
	pf.BoolVarP(&verbose, "verbose", "v", false, "say more on stderr: the backend (password masked) and its TLS state, who holds a lock while waiting, grants and releases")
	pf.StringVar(&logFormat, "log-format", logText, "format of dlock's messages on stderr: text (\"dlock: ...\" lines) or json (one slog record per line)")
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		return e.setupLog(verbose, logFormat)
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageErr(fmt.Errorf("%s: %w (see '%s --help')", cmd.Name(), err, cmd.CommandPath()))
	})
	root.AddCommand(newRunCmd(e), newStatusCmd(e), newWaitCmd(e), newReleaseCmd(e), newServeCmd(e),
		newCheckCmd(e), newCheckWorkerCmd(), newBenchCmd(e))
	return root
}
