package heapfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPercentFor(t *testing.T) {
	for _, c := range []struct {
		name           string
		live, headroom uint64
		want           int
	}{
		// Before the first collection: the runtime's minimum goal, 4 MiB
		// at 100%, scaled to the headroom.
		{"no collection yet", 0, 32 * mib, 800},
		// Under 4 MiB live, headroom/live (3200%) would put the minimum
		// goal at 128 MiB: the percent that reaches live + headroom
		// through the minimum is used instead.
		{"small heap", 1 * mib, 32 * mib, 825},
		{"heap of the minimum", 4 * mib, 32 * mib, 800},
		{"medium heap", 16 * mib, 32 * mib, 200},
		{"heap of the headroom", 32 * mib, 32 * mib, 100},
		// A heap larger than the headroom grows by itself, as at GOGC=100.
		{"large heap", 64 * mib, 32 * mib, 100},
		{"bounded", 1 * mib, 1 << 40, maxPercent},
	} {
		if got := percentFor(c.live, c.headroom); got != c.want {
			t.Errorf("%s: percentFor(%d MiB, %d MiB) = %d, want %d", c.name, c.live/mib, c.headroom/mib, got, c.want)
		}
	}
}

// readGC reads the runtime's own view of its pace.
func readGC() (percent, live, goal uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
}

// collect runs a collection and waits until the floor has adjusted to the
// live heap it found (the adjustment runs after the collection, on the
// runtime's cleanup goroutine).
func collect(t *testing.T, f *Floor, headroom uint64) (percent, live, goal uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		percent, live, goal = readGC()
		want := percentFor(live, headroom)
		if uint64(f.Percent()) == percent && percent == uint64(want) {
			return percent, live, goal
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a collection: GC percent %d, the floor's %d, want %d for %d bytes live", percent, f.Percent(), want, live)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var keep [][]byte

// TestHeapGoal checks the heap goal the runtime itself reports: live plus
// the headroom while the live heap is small, twice the live heap once it
// is larger than the headroom, and Go's default pace after Stop.
func TestHeapGoal(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const headroom = 16 * mib
	f := Start(headroom)
	defer f.Stop()

	percent, live, goal := collect(t, f, headroom)
	// The goal also counts stacks and globals at the same percent; a test
	// binary's are a few hundred kilobytes.
	if low, high := live+headroom, live+headroom+4*mib; goal < low || goal > high {
		t.Errorf("small heap (%d bytes live, %d%%): goal %d MiB, want between %d and %d MiB", live, percent, goal/mib, low/mib, high/mib)
	}

	for range 48 {
		keep = append(keep, make([]byte, mib))
	}
	percent, live, goal = collect(t, f, headroom)
	if percent != 100 {
		t.Errorf("large heap (%d MiB live): GC percent %d, want 100", live/mib, percent)
	}
	if goal < 2*live {
		t.Errorf("large heap (%d MiB live): goal %d MiB, want at least twice the live heap", live/mib, goal/mib)
	}
	keep = nil
	collect(t, f, headroom)

	f.Stop()
	runtime.GC()
	runtime.GC()
	if percent, _, _ := readGC(); percent != 100 || f.Percent() != 100 {
		t.Errorf("after Stop and two collections: GC percent %d (the floor's %d), want 100", percent, f.Percent())
	}
	f.Stop() // a second Stop is harmless
}
