package cli

import (
	"os"
	"runtime/debug"
	"testing"
)

func TestProxyGCPercent(t *testing.T) {
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	t.Setenv("GOGC", "50")
	setProxyGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=50 in the environment: the proxy set the target to %d; want it left alone", got)
	}
	os.Unsetenv("GOGC")
	setProxyGC()
	if got := debug.SetGCPercent(100); got != proxyGCPercent {
		t.Errorf("no GOGC in the environment: target %d, want %d", got, proxyGCPercent)
	}
}
