package redisscript

import (
	"context"
	"errors"
	"slices"

	"github.com/redis/go-redis/v9"
)

// evalScript runs one script as redis.Script.Run does (EVALSHA, then EVAL
// when the server answers NOSCRIPT) for the calls of every lease: it sends
// the command it builds itself on the go-redis clients whose Process runs a
// command as their EvalSha would (see processorOf). go-redis's EvalSha takes
// the keys as a []string and the arguments as a variadic []any, and copies
// both into a third slice, boxing the command's name and the script's
// digest again on every call: 4 allocations (≈350 B for the acquire
// script's 4 keys and 5 arguments) that evalArgs's one slice, with the name
// and digest boxed once here, does without. What the server receives, and
// what go-redis's hooks see (cmd.Args, cmd.String: strings and integers as
// before), is unchanged.
type evalScript struct {
	s   *redis.Script
	sha any // s.Hash(), boxed once
	src any // the script's source, boxed once
}

func newEvalScript(src string) evalScript {
	s := redis.NewScript(src)
	return evalScript{s: s, sha: s.Hash(), src: src}
}

// The command names, boxed once.
var (
	evalshaName any = "evalsha"
	evalName    any = "eval"
)

// evalHead is how many arguments of an evalArgs slice come before the
// keys: the command's name, the script (digest or source) and the number
// of keys.
const evalHead = 3

// evalArgs returns a slice for a call of a script with nkeys keys and
// nargs arguments, in one allocation: the keys go at [evalHead:], the
// arguments after them (append them in that order); run fills the head.
func evalArgs(nkeys, nargs int) []any {
	a := make([]any, evalHead, evalHead+nkeys+nargs)
	a[2] = nkeys // an int below 256: boxing it does not allocate
	return a
}

// noScript reports whether err is the server's answer to an EVALSHA of a
// script it does not have, as redis.Script.Run tells it. (Both tests
// allocate: callers ask only about an error.)
func noScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// processor is a go-redis client or connection that runs a command it is
// given, through its hooks, as its own commands are run.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// processorOf returns c as a processor when its EvalSha and Eval are
// go-redis's own, which run the command they build with Process: then
// running that command with Process is the same call. A type that wraps a
// client (a lane, a client that runs scripts on one connection) may route
// its script calls elsewhere than its Process: it is not one, and run goes
// through its EvalSha and Eval.
func processorOf(c redis.Scripter) processor {
	switch p := c.(type) {
	case *redis.Client:
		return p
	case *redis.Conn:
		return p
	case *redis.ClusterClient:
		return p
	case *redis.Ring:
		return p
	}
	return nil
}

// run runs the script on p (see processorOf) with args from evalArgs
// (nkeys keys, then the arguments), as s.Run(ctx, p, keys, arguments...)
// does. A caller whose client is not a processor runs s.Run itself, with
// the keys in a []string: boxing each key into args would cost an
// allocation per key that go-redis's EvalSha on such a client (a lane, a
// Redlock node) then does again.
func (e *evalScript) run(ctx context.Context, p processor, args []any) *redis.Cmd {
	nkeys := args[2].(int)
	args[0], args[1] = evalshaName, e.sha
	cmd := redis.NewCmd(ctx, args...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(evalHead)
	}
	_ = p.Process(ctx, cmd)
	if err := cmd.Err(); err != nil && noScript(err) {
		// The server does not have the script (a restart, SCRIPT
		// FLUSH): send it whole. A fresh slice, as the first command's
		// may still be referred to (a hook).
		args = slices.Clone(args)
		args[0], args[1] = evalName, e.src
		cmd = redis.NewCmd(ctx, args...)
		if nkeys > 0 {
			cmd.SetFirstKeyPos(evalHead)
		}
		_ = p.Process(ctx, cmd)
	}
	return cmd
}
