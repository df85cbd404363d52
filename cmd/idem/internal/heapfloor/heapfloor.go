// Package heapfloor keeps Go's garbage collector from running every few
// dozen requests in a process whose live heap is small.
//
// Go starts a collection once the heap has grown by GOGC percent (100 by
// default) of what the previous one found live, and never below 4 MB. A
// proxy in front of a database keeps little alive between requests (its
// connections, pools and buffers: a few megabytes), so nearly every byte a
// request allocates is garbage by the next one, and a collection comes
// every few dozen requests. Each pays a fixed cost (stacks and globals
// scanned, every goroutine's cache flushed), which a larger live heap would
// spread over more requests.
//
// Start lets the heap grow by the larger of the live heap (Go's default,
// GOGC=100) and a fixed headroom before the next collection: after every
// collection it sets the GC percent so that the next one comes once the
// heap has grown by headroom, but never by less than the live heap. A small
// heap then gets the headroom; a large one (a memory store, a filled replay
// cache) is collected as without this package, so the headroom is all the
// extra memory it costs.
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
	// maxPercent bounds the GC percent set.
	maxPercent = 10000
	// heapMinimum is the runtime's least heap goal at GOGC=100; it
	// scales with the GC percent (runtime/mgcpacer.go).
	heapMinimum = 4 << 20
)

// Floor adjusts the GC percent after every collection; see Start.
type Floor struct {
	headroom uint64

	mu      sync.Mutex
	stopped bool
	percent int // what set last chose
	sample  []metrics.Sample
}

// Start keeps at least headroom bytes of growth allowed between
// collections, and the live heap's size when that is more. Stop hands the
// collector back to Go's default pace.
//
// A process whose environment sets GOGC has chosen its collector's pace:
// start a Floor only when it does not.
func Start(headroom uint64) *Floor {
	f := &Floor{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	f.set()
	f.arm()
	return f
}

// Percent reports the GC percent last set.
func (f *Floor) Percent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.percent
}

// Stop leaves the GC percent at Go's default and stops adjusting it.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	f.percent = basePercent
	debug.SetGCPercent(basePercent)
}

// sentinel is allocated for the collector to find unreachable: its cleanup
// runs once per collection, after it.
type sentinel struct{ _ [16]byte }

// arm registers the adjustment to run after the next collection.
func (f *Floor) arm() {
	runtime.AddCleanup(new(sentinel), func(f *Floor) {
		if f.set() {
			f.arm()
		}
	}, f)
}

// set chooses the percent from the live heap the last collection found,
// and reports false once stopped.
func (f *Floor) set() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	metrics.Read(f.sample)
	p := percentFor(f.sample[0].Value.Uint64(), f.headroom)
	if p != f.percent {
		debug.SetGCPercent(p)
		f.percent = p
	}
	return true
}

// percentFor is the GC percent that puts the next heap goal at live +
// headroom, and never below live + live (GOGC=100).
//
// The runtime's goal is live × (1 + percent/100), but at least heapMinimum
// × percent/100: for a live heap under heapMinimum, percent = headroom/live
// would raise that minimum far past live + headroom (a 1 MB heap with 32
// MB of headroom: 128 MB). The percent is the smaller of the two that
// reach live + headroom.
func percentFor(live, headroom uint64) int {
	goal := float64(live) + float64(headroom)
	p := goal / heapMinimum * 100
	if live > 0 {
		p = min(p, float64(headroom)/float64(live)*100)
	}
	return int(min(max(math.Ceil(p), basePercent), maxPercent))
}
