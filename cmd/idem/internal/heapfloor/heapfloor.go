// Package heapfloor keeps Go's garbage collector from running every few
// dozen requests in a process whose live heap is small.
//
// Go starts a collection once the heap has grown by GOGC percent (100 by
// default) of what the previous one found live (with the goroutines'
// stacks and the globals), and not before the heap reaches 4 MiB. A proxy
// in front of a database keeps little alive between requests (its
// connections, pools and buffers: a few megabytes), so nearly every byte a
// request allocates is garbage by the next one, and a collection comes
// every few dozen requests. Each pays a fixed cost (stacks and globals
// scanned, every P's allocation cache flushed), which a larger live heap
// would spread over more requests.
//
// Start lets the heap grow by the larger of what Go's default allows and a
// fixed headroom before the next collection: after every collection it
// sets the GC percent so that the next one comes once the heap has grown
// by headroom, but never by less than GOGC=100 would let it. A small heap
// then gets the headroom; a large one (a memory store, a filled replay
// cache, many goroutines' stacks) is collected as without this package.
//
// The headroom bounds the extra memory in a steady state. The percent is
// set just after each collection, from what it found live: a live heap
// that grows several times over within one cycle runs that cycle at the
// percent chosen for the smaller heap (at most headroom/4 MiB + 1 times
// the new live heap, 9 times with 32 MiB). GOMEMLIMIT, which the runtime
// applies whatever the percent, is the ceiling to set where memory is
// tight.
package heapfloor

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

const (
	// basePercent is Go's default GOGC: the least growth allowed.
	basePercent = 100
	// maxPercent bounds the GC percent set: headrooms above about 396
	// MiB act as that much on a small heap.
	maxPercent = 10000
	// heapMinimum is the runtime's least heap goal at GOGC=100; it
	// scales with the GC percent (runtime/mgcpacer.go).
	heapMinimum = 4 << 20
)

// Floor adjusts the GC percent after every collection; see Start.
type Floor struct {
	headroom uint64
	orig     int // the GC percent Start found

	mu      sync.Mutex
	stopped bool
	percent int             // what set last chose
	cleanup runtime.Cleanup // the adjustment armed for the next collection
	arms    int             // adjustments armed, for tests
	sample  []metrics.Sample
}

// Start keeps at least headroom bytes of growth allowed between
// collections, and what GOGC=100 allows when that is more. Stop hands the
// collector back as Start found it.
//
// A process whose environment sets GOGC has chosen its collector's pace:
// start a Floor only when it does not.
func Start(headroom uint64) *Floor {
	f := &Floor{headroom: headroom, sample: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"},
	}}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.orig = debug.SetGCPercent(basePercent)
	f.percent = basePercent
	f.set()
	f.arm()
	return f
}

// Stop restores the GC percent Start found and stops adjusting it.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	f.cleanup.Stop()
	debug.SetGCPercent(f.orig)
}

// sentinel is allocated for the collector to find unreachable: its cleanup
// runs once per collection, after it. It holds a pointer so that it is an
// object of its own, never part of a tiny allocation block that other
// objects would keep alive.
type sentinel struct{ _ *byte }

// arm registers the adjustment to run after the next collection. f.mu is
// held.
func (f *Floor) arm() {
	f.arms++
	f.cleanup = runtime.AddCleanup(new(sentinel), func(f *Floor) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !f.stopped {
			f.set()
			f.arm()
		}
	}, f)
}

// set chooses the percent from what the last collection found. f.mu is
// held.
func (f *Floor) set() {
	metrics.Read(f.sample)
	live, stacks, globals := f.sample[0].Value.Uint64(), f.sample[1].Value.Uint64(), f.sample[2].Value.Uint64()
	if p := percentFor(live, stacks+globals, f.headroom); p != f.percent {
		debug.SetGCPercent(p)
		f.percent = p
	}
}

// percentFor is the GC percent that puts the next heap goal at live +
// headroom, and never below what GOGC=100 gives.
//
// The runtime's goal is live + (live + roots) × percent/100, where roots
// are the stacks and globals it scanned, but at least heapMinimum ×
// percent/100: for a live heap under heapMinimum, percent =
// headroom/(live + roots) would raise that minimum far past live +
// headroom (a 1 MiB heap with 32 MiB of headroom: 128 MiB). The percent is
// the smaller of the two that reach live + headroom.
func percentFor(live, roots, headroom uint64) int {
	p := (float64(live) + float64(headroom)) / heapMinimum * 100
	if base := live + roots; base > 0 {
		p = min(p, float64(headroom)/float64(base)*100)
	}
	return int(min(max(math.Ceil(p), basePercent), maxPercent))
}
