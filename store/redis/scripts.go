package redis

import (
	"context"
	"embed"
	"fmt"

	goredis "github.com/redis/go-redis/v9"
)

// The Lua scripts are the store's only state transitions; each runs as one
// EVALSHA (EVAL once per server after a cache flush), so every operation is
// one round trip and atomic.
//
//go:embed lua/*.lua
var luaFS embed.FS

var (
	scriptReserve    = loadScript("reserve")
	scriptComplete   = loadScript("complete")
	scriptRelease    = loadScript("release")
	scriptCheckpoint = loadScript("checkpoint")
	scriptExtend     = loadScript("extend")
	scriptDelete     = loadScript("delete")
	scriptResolve    = loadScript("resolve")
	scriptDefer      = loadScript("defer")
	scriptDue        = loadScript("due")
	scriptSweep      = loadScript("sweep")
	scriptReap       = loadScript("reap")
)

// loadScript prepends the shared helpers of lib.lua to a script.
func loadScript(name string) *goredis.Script {
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("idem/redis: missing script %s: %v", name, err))
	}
	return goredis.NewScript(string(lib) + "\n" + string(body))
}

// Script result codes of the single-record transitions.
const (
	codeDone   = 0
	codeAbsent = 1
	codeState  = 2 // wrong state or fence
	codeFence  = 3 // resolve, defer, delete: another fence
)

// noReplay is a script call that changes records, which the client must
// never send again by itself: go-redis resends a command whose connection
// broke before its reply came, and a script that ran already would run
// twice, the second run meeting the first one's result and answering for
// it (a Complete that landed reported as store.ErrLeaseLost, a Reserve that
// created the record as a duplicate in flight). The broken connection is
// returned instead, retryable, so that the caller knows the call may have
// been applied. Read-only scripts are retried as usual.
type noReplay struct{ *goredis.Cmd }

func (noReplay) NoRetry() bool { return true }

// scriptRunner is what a script is run on: a client or a pipeline.
type scriptRunner interface {
	goredis.Scripter
	Process(ctx context.Context, cmd goredis.Cmder) error
}

// once runs EVAL and EVALSHA on r as noReplay calls (see Script.Run,
// Script.EvalSha and Script.Eval); the other methods are r's.
type once struct{ scriptRunner }

func (o once) Eval(ctx context.Context, src string, keys []string, args ...any) *goredis.Cmd {
	return o.eval(ctx, "eval", src, keys, args)
}

func (o once) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *goredis.Cmd {
	return o.eval(ctx, "evalsha", sha, keys, args)
}

// eval builds the command as go-redis's own Eval does.
func (o once) eval(ctx context.Context, name, script string, keys []string, args []any) *goredis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, script, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := goredis.NewCmd(ctx, append(cmdArgs, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3) // the cluster routes by the first key
	}
	_ = o.Process(ctx, noReplay{cmd})
	return cmd
}
