// Package groupcommit gathers concurrent store calls into batches that
// share one database commit, without ever making a call wait for a timer.
//
// A Group has a fixed number of slots. A call that finds a slot free runs
// at once, alone, on its own goroutine: a lone request pays nothing. A call
// that finds every slot busy queues. When a slot's work returns, everything
// queued by then leaves together as one batch, in the slot just released,
// as in a database's own group commit: the batch is only what piled up
// while the database was busy with the previous one.
//
// Few slots make large batches, and so the fewest commits, but a slot whose
// work hangs (a statement waiting for a lock another transaction holds)
// holds up every call queued behind it. With Unstall, a queue that has not
// moved for a while gets extra slots, one batch at a time, so that a hung
// slot delays the calls behind it by about twice that while at most (the
// queue is looked at once a while, and a look that finds that a slot moved
// since the last one waits another while: a slot that moved just after a
// look, then hung, is found at the look after next).
package groupcommit

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Group runs operations of type T alone or in batches. Its zero value is
// not usable; see New.
type Group[T any] struct {
	one   func(ctx context.Context, op T)
	batch func(ctx context.Context, ops []T)
	max   int

	stall    time.Duration // Unstall's while; 0: never
	maxExtra int           // extra slots at most

	mu       sync.Mutex
	free     int
	pending  []*call[T]
	moves    uint64 // work started or finished in the regular slots
	watching bool   // a stall check is armed
	extra    int    // extra slots in use
	flights  sync.WaitGroup
	batched  atomic.Int64
	stalls   atomic.Int64
}

type call[T any] struct {
	ctx   context.Context
	op    T
	done  chan struct{}
	taken bool // in a batch already; guarded by Group.mu
}

// New returns a group of slots slots (at least 1) whose batches hold at
// most maxBatch operations (at least 2). one runs an operation alone with
// its caller's context; batch runs two or more under a context that ends
// at the latest deadline of their callers (none if one has none) and that
// no caller's cancellation ends. Both record their results in the
// operations themselves (T is typically a pointer).
func New[T any](slots, maxBatch int, one func(context.Context, T), batch func(context.Context, []T)) *Group[T] {
	return &Group[T]{one: one, batch: batch, max: max(2, maxBatch), free: max(1, slots)}
}

// Unstall lets the group open up to extra more slots when calls are
// queued and no regular slot has started or finished any work for the
// while after: each extra slot takes what is queued as one batch, then
// closes. Calls that find a regular slot free are not affected, nor is the
// batching of a queue that moves. Unstall(0, 0) turns this off again.
func (g *Group[T]) Unstall(after time.Duration, extra int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stall, g.maxExtra = after, extra
}

// Do runs op, alone or in a batch, and returns once op's results are
// recorded. It returns ctx's error instead when ctx ends while op waits:
// before op was taken into a batch, op never runs; after, op's outcome is
// unknown to the caller, as with any statement abandoned in flight, and the
// caller must not read op's results.
func (g *Group[T]) Do(ctx context.Context, op T) error {
	g.mu.Lock()
	if g.free > 0 {
		g.free--
		g.moves++
		g.mu.Unlock()
		g.one(ctx, op)
		g.release()
		return nil
	}
	c := &call[T]{ctx: ctx, op: op, done: make(chan struct{})}
	g.pending = append(g.pending, c)
	if g.stall > 0 && !g.watching {
		g.watching = true
		g.watchAfter(g.moves)
	}
	g.mu.Unlock()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if !c.taken {
		if i := slices.Index(g.pending, c); i >= 0 {
			g.pending = slices.Delete(g.pending, i, i+1)
		}
	}
	g.mu.Unlock()
	return ctx.Err()
}

// Wait waits for the batches in flight.
func (g *Group[T]) Wait() { g.flights.Wait() }

// watchAfter checks the queue once the stall while has passed, against the
// regular slots' moves seen now.
func (g *Group[T]) watchAfter(seen uint64) {
	time.AfterFunc(g.stall, func() { g.watch(seen) })
}

// watch opens an extra slot for the queued calls when the regular slots
// have not moved since seen, and keeps watching while calls are queued.
func (g *Group[T]) watch(seen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pending) == 0 {
		g.watching = false
		return
	}
	if g.stall <= 0 {
		g.watching = false
		return
	}
	if g.moves == seen && g.extra < g.maxExtra {
		g.extra++
		g.stalls.Add(1)
		calls := g.take()
		g.flights.Add(1)
		go func() {
			defer g.flights.Done()
			g.run(calls)
			g.mu.Lock()
			g.extra--
			g.mu.Unlock()
		}()
	}
	g.watchAfter(g.moves)
}

// Stalls reports how many times an extra slot was opened (see Unstall).
func (g *Group[T]) Stalls() int64 { return g.stalls.Load() }

// Batched reports how many operations ran in batches of two or more.
func (g *Group[T]) Batched() int64 { return g.batched.Load() }

// Queue reports the free slots and the operations waiting for one.
func (g *Group[T]) Queue() (free, pending int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.free, len(g.pending)
}

// release hands a slot to what queued meanwhile, or frees it.
func (g *Group[T]) release() {
	if calls := g.next(); calls != nil {
		g.flights.Add(1)
		go func() {
			defer g.flights.Done()
			for calls != nil {
				g.run(calls)
				calls = g.next()
			}
		}()
	}
}

// next takes the queued calls for the slot being released, or frees the
// slot when nothing waits.
func (g *Group[T]) next() []*call[T] {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.moves++
	if len(g.pending) == 0 {
		g.free++
		return nil
	}
	return g.take()
}

// take removes the first calls queued, up to a batch, from the queue.
// g.mu is held.
func (g *Group[T]) take() []*call[T] {
	n := min(len(g.pending), g.max)
	calls := slices.Clone(g.pending[:n])
	g.pending = slices.Delete(g.pending, 0, n)
	for _, c := range calls {
		c.taken = true
	}
	return calls
}

func (g *Group[T]) run(calls []*call[T]) {
	defer func() {
		for _, c := range calls {
			close(c.done)
		}
	}()
	if len(calls) == 1 {
		g.one(calls[0].ctx, calls[0].op)
		return
	}
	g.batched.Add(int64(len(calls)))
	ops := make([]T, len(calls))
	for i, c := range calls {
		ops[i] = c.op
	}
	ctx, cancel := batchContext(calls)
	defer cancel()
	g.batch(ctx, ops)
}

// batchContext outlives no caller that still waits, and a caller that
// gives up does not cancel the others' work.
func batchContext[T any](calls []*call[T]) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(calls[0].ctx)
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(base)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(base, latest)
}
