package redis

import (
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
