package heapfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPercentFor(t *testing.T) {
	for _, c := range []struct {
		name                  string
		live, roots, headroom uint64
		want                  int
	}{
		// Before the first collection: the runtime's minimum goal, 4 MiB
		// at 100%, scaled to the headroom.
		{"no collection yet", 0, 0, 32 * mib, 800},
		// Under 4 MiB live, headroom/live (3200%) would put the minimum
		// goal at 128 MiB: the percent that reaches live + headroom
		// through the minimum is used instead.
		{"small heap", 1 * mib, 0, 32 * mib, 825},
		{"small heap, some stacks", 1 * mib, mib / 2, 32 * mib, 825},
		{"heap of the minimum", 4 * mib, 0, 32 * mib, 800},
		{"medium heap", 16 * mib, 0, 32 * mib, 200},
		// The runtime grows the goal by the stacks and globals too.
		{"medium heap, 16 MiB of stacks", 16 * mib, 16 * mib, 32 * mib, 100},
		{"medium heap, 8 MiB of stacks", 16 * mib, 8 * mib, 32 * mib, 134},
		{"heap of the headroom", 32 * mib, 0, 32 * mib, 100},
		// A heap larger than the headroom grows by itself, as at GOGC=100.
		{"large heap", 64 * mib, 0, 32 * mib, 100},
		{"many goroutines", 9 * mib, 35 * mib, 32 * mib, 100},
		{"bounded", 1 * mib, 0, 1 << 40, maxPercent},
	} {
		if got := percentFor(c.live, c.roots, c.headroom); got != c.want {
			t.Errorf("%s: percentFor(%d, %d, %d MiB) = %d, want %d", c.name, c.live, c.roots, c.headroom/mib, got, c.want)
		}
	}
}

// gcState is the runtime's own view of its pace.
type gcState struct {
	percent, live, roots, goal uint64
}

func readGC() gcState {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return gcState{s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64() + s[3].Value.Uint64(), s[4].Value.Uint64()}
}

func (f *Floor) state() (percent, arms int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.percent, f.arms
}

// collect runs a collection and waits until the floor has adjusted to what
// it found (the adjustment runs after the collection, on the runtime's
// cleanup goroutine).
func collect(t *testing.T, f *Floor, headroom uint64) gcState {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		time.Sleep(time.Millisecond)
		g := readGC()
		want := percentFor(g.live, g.roots, headroom)
		if p, _ := f.state(); uint64(p) == g.percent && g.percent == uint64(want) {
			return g
		}
		if time.Now().After(deadline) {
			p, _ := f.state()
			t.Fatalf("after a collection: GC percent %d, the floor's %d, want %d for %d bytes live and %d of roots", g.percent, p, want, g.live, g.roots)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var keep [][]byte

// TestHeapGoal checks the heap goal the runtime itself reports: live plus
// the headroom while the live heap is small, what GOGC=100 gives once it
// is larger than the headroom, and the percent found at Start after Stop.
func TestHeapGoal(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(150))
	const headroom = 16 * mib
	f := Start(headroom)
	defer f.Stop()

	g := collect(t, f, headroom)
	if low, high := g.live+headroom, g.live+headroom+mib; g.goal < low || g.goal > high {
		t.Errorf("small heap (%d bytes live, %d%%): goal %d bytes, want between %d and %d", g.live, g.percent, g.goal, low, high)
	}

	for range 48 {
		keep = append(keep, make([]byte, mib))
	}
	g = collect(t, f, headroom)
	if g.percent != 100 {
		t.Errorf("large heap (%d MiB live): GC percent %d, want 100", g.live/mib, g.percent)
	}
	if g.goal < 2*g.live {
		t.Errorf("large heap (%d MiB live): goal %d MiB, want at least twice the live heap", g.live/mib, g.goal/mib)
	}
	keep = nil
	collect(t, f, headroom)

	// The chain of adjustments goes on from collection to collection, and
	// stops with Stop.
	_, before := f.state()
	collect(t, f, headroom)
	collect(t, f, headroom)
	if _, after := f.state(); after <= before {
		t.Errorf("adjustments armed: %d, then %d after two collections; want more", before, after)
	}
	f.Stop()
	_, stopped := f.state()
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	if g := readGC(); g.percent != 150 {
		t.Errorf("after Stop and three collections: GC percent %d, want the 150 found at Start", g.percent)
	}
	if _, arms := f.state(); arms != stopped {
		t.Errorf("after Stop: %d adjustments armed, then %d after three collections; want none", stopped, arms)
	}
	f.Stop() // a second Stop is harmless
}

// TestManyGoroutines checks that stacks count: with more stack than the
// headroom, the goal is what GOGC=100 gives, not far past it.
func TestManyGoroutines(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const headroom = 16 * mib
	release := make(chan struct{})
	var wg, grown sync.WaitGroup
	grown.Add(2000)
	for range 2000 {
		wg.Go(func() { deep(64, &grown, release) })
	}
	defer func() { close(release); wg.Wait() }()
	grown.Wait() // every stack at its depth, however slowly they were scheduled

	f := Start(headroom)
	defer f.Stop()
	g := collect(t, f, headroom)
	if g.roots < 2*headroom {
		t.Fatalf("only %d MiB of stacks and globals: the test needs more than the headroom", g.roots/mib)
	}
	if def := 2*g.live + g.roots; g.goal > def+mib {
		t.Errorf("%d MiB live, %d MiB of stacks and globals: goal %d MiB at %d%%, want no more than Go's default %d MiB", g.live/mib, g.roots/mib, g.goal/mib, g.percent, def/mib)
	}
}

// deep grows its goroutine's stack by n frames of 256 bytes, says so on
// grown, then waits for release.
func deep(n int, grown *sync.WaitGroup, release chan struct{}) byte {
	var pad [256]byte
	pad[n%256] = byte(n)
	if n > 0 {
		return deep(n-1, grown, release) + pad[(n+1)%256]
	}
	grown.Done()
	<-release
	return pad[0]
}
