package groupcommit_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/groupcommit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type op struct {
	n     int
	alone bool
	batch int // size of the batch it ran in
}

// waitQueue waits until g has the given free slots and pending calls.
func waitQueue(t *testing.T, g *groupcommit.Group[*op], free, pending int) {
	t.Helper()
	for i := 0; ; i++ {
		f, p := g.Queue()
		if f == free && p == pending {
			return
		}
		if i == 10000 {
			t.Fatalf("queue: %d free, %d pending; want %d, %d", f, p, free, pending)
		}
		time.Sleep(time.Millisecond)
	}
}

// runLog records the batches a group ran and their deadlines.
type runLog struct {
	mu        sync.Mutex
	batches   [][]int
	deadlines []time.Time
}

// gatedGroup is a group of one slot and batches of maxBatch, whose call
// n == 0 holds the slot until gate closes; its batches go to l.
func gatedGroup(maxBatch int, gate <-chan struct{}, l *runLog) *groupcommit.Group[*op] {
	return groupcommit.New(1, maxBatch,
		func(ctx context.Context, o *op) {
			if o.n == 0 {
				<-gate
			}
			o.alone = true
		},
		func(ctx context.Context, ops []*op) {
			l.mu.Lock()
			defer l.mu.Unlock()
			var ns []int
			for _, o := range ops {
				o.batch = len(ops)
				ns = append(ns, o.n)
			}
			l.batches = append(l.batches, ns)
			d, _ := ctx.Deadline()
			l.deadlines = append(l.deadlines, d)
		})
}

func TestGroup(t *testing.T) {
	gate := make(chan struct{})
	var l runLog
	g := gatedGroup(4, gate, &l)

	// A lone call runs alone at once.
	lone := &op{n: -1}
	if err := g.Do(context.Background(), lone); err != nil || !lone.alone {
		t.Fatalf("lone call: %+v, %v", lone, err)
	}

	ops := make([]*op, 7)
	for i := range ops {
		ops[i] = &op{n: i}
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Do(context.Background(), ops[0]) })
	waitQueue(t, g, 0, 0)

	// Queued calls wait for the slot; one whose context ends leaves the
	// queue and never runs.
	soon := time.Now().Add(time.Hour)
	later := soon.Add(time.Hour)
	errs := make([]error, len(ops))
	for i := 1; i < len(ops); i++ {
		ctx, cancel := context.WithDeadline(context.Background(), soon)
		if i == 3 {
			ctx, cancel = context.WithDeadline(context.Background(), later)
		}
		defer cancel()
		wg.Go(func() { errs[i] = g.Do(ctx, ops[i]) })
		waitQueue(t, g, 0, i)
	}
	abandoned := &op{n: 99}
	actx, cancel := context.WithCancel(context.Background())
	aerr := make(chan error)
	go func() { aerr <- g.Do(actx, abandoned) }()
	waitQueue(t, g, 0, len(ops))
	cancel()
	if err := <-aerr; !errors.Is(err, context.Canceled) {
		t.Errorf("abandoned call: %v", err)
	}
	waitQueue(t, g, 0, len(ops)-1)

	close(gate)
	wg.Wait()
	g.Wait()
	waitQueue(t, g, 1, 0)
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	// Six queued calls, at most four a batch: the first four, then two.
	if want := [][]int{{1, 2, 3, 4}, {5, 6}}; !slices.EqualFunc(l.batches, want, slices.Equal) {
		t.Errorf("batches %v, want %v", l.batches, want)
	}
	if !l.deadlines[0].Equal(later) || !l.deadlines[1].Equal(soon) {
		t.Errorf("batch deadlines %v, want the latest of their calls (%v, %v)", l.deadlines, later, soon)
	}
	if abandoned.alone || abandoned.batch != 0 {
		t.Errorf("the abandoned call ran: %+v", abandoned)
	}
	if got := g.Batched(); got != 6 {
		t.Errorf("Batched() = %d, want 6", got)
	}
}

func TestNoDeadlineMeansNone(t *testing.T) {
	gate := make(chan struct{})
	var hasDeadline []bool
	g := groupcommit.New(1, 8,
		func(ctx context.Context, o *op) {
			if o.n == 0 {
				<-gate
			}
		},
		func(ctx context.Context, ops []*op) {
			_, ok := ctx.Deadline()
			hasDeadline = append(hasDeadline, ok)
		})
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Do(context.Background(), &op{n: 0}) })
	waitQueue(t, g, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	wg.Go(func() { _ = g.Do(ctx, &op{n: 1}) })
	waitQueue(t, g, 0, 1)
	wg.Go(func() { _ = g.Do(context.Background(), &op{n: 2}) })
	waitQueue(t, g, 0, 2)
	close(gate)
	wg.Wait()
	g.Wait()
	if !slices.Equal(hasDeadline, []bool{false}) {
		t.Errorf("batch deadlines: %v, want one batch without a deadline", hasDeadline)
	}
}

// TestCallerLeavingKeepsTheBatch: a caller that gives up once its call is
// in a batch gets its context's error at once, and ends neither the
// batch's context nor its other calls. The batch's statements run on one
// connection for every call: a context ending there would stop the
// others' statements too (pgx cancels the statement and closes the
// connection).
func TestCallerLeavingKeepsTheBatch(t *testing.T) {
	gate, running, left := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var batchErr error
	g := groupcommit.New(1, 8,
		func(ctx context.Context, o *op) {
			if o.n == 0 {
				<-gate
			}
			o.alone = true
		},
		func(ctx context.Context, ops []*op) {
			close(running)
			<-left
			batchErr = ctx.Err()
			for _, o := range ops {
				o.batch = len(ops)
			}
		})
	// The first call queued, whose context the batch's derives from, is
	// the one that leaves.
	q := queueTwo(t, g)
	close(gate)
	<-running
	q.leave(t)
	close(left)
	q.wg.Wait()
	g.Wait()
	if batchErr != nil {
		t.Errorf("the batch's context ended with its first caller's: %v", batchErr)
	}
	if q.stayErr != nil || q.stay.batch != 2 {
		t.Errorf("the call that stayed: %+v %v, want its batch of 2 done", q.stay, q.stayErr)
	}
}

// queuedTwo is two calls queued behind a call that holds a group's one
// slot: the first queued can be made to leave, the second stays.
type queuedTwo struct {
	wg      sync.WaitGroup
	leaving *op
	stay    *op
	cancel  context.CancelFunc
	leftErr chan error
	stayErr error
}

// queueTwo starts a call that takes g's one slot (op 0), then queues op 1,
// whose context leave ends, and op 2 behind it.
func queueTwo(t *testing.T, g *groupcommit.Group[*op]) *queuedTwo {
	t.Helper()
	q := &queuedTwo{leaving: &op{n: 1}, stay: &op{n: 2}, leftErr: make(chan error, 1)}
	q.wg.Go(func() { _ = g.Do(context.Background(), &op{n: 0}) })
	waitQueue(t, g, 0, 0)
	ctx, cancel := context.WithCancel(context.Background())
	q.cancel = cancel
	t.Cleanup(cancel)
	go func() { q.leftErr <- g.Do(ctx, q.leaving) }()
	waitQueue(t, g, 0, 1)
	q.wg.Go(func() { q.stayErr = g.Do(context.Background(), q.stay) })
	waitQueue(t, g, 0, 2)
	return q
}

// leave ends the first queued call's context and waits for it to return
// its context's error.
func (q *queuedTwo) leave(t *testing.T) {
	t.Helper()
	q.cancel()
	if err := <-q.leftErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the call that left: %v, want context.Canceled", err)
	}
}

// With Unstall, calls queued behind a slot whose work hangs run in an
// extra slot once the queue has not moved for the while; without it they
// wait for the hung slot (TestGroup).
func TestUnstall(t *testing.T) {
	gate := make(chan struct{})
	var l runLog
	g := gatedGroup(8, gate, &l)
	g.Unstall(20*time.Millisecond, 1)

	var hung sync.WaitGroup
	hung.Go(func() { _ = g.Do(context.Background(), &op{n: 0}) })
	waitQueue(t, g, 0, 0)

	ops := []*op{{n: 1}, {n: 2}, {n: 3}}
	var wg sync.WaitGroup
	for _, o := range ops {
		wg.Go(func() { _ = g.Do(context.Background(), o) })
	}
	wg.Wait() // returns although the only regular slot still hangs
	if g.Stalls() < 1 {
		t.Fatal("no extra slot was opened")
	}
	// Each queued call ran once, in an extra slot: as one batch when all
	// three had queued within the while, else in several.
	ran := map[int]int{}
	for _, b := range l.batches {
		for _, n := range b {
			ran[n]++
		}
	}
	for _, o := range ops {
		if o.alone {
			ran[o.n]++
		}
	}
	if len(ran) != 3 || ran[1] != 1 || ran[2] != 1 || ran[3] != 1 {
		t.Fatalf("runs per call %v, want each of 1, 2, 3 once", ran)
	}

	// A lone call behind the hung slot runs alone in the next extra slot.
	late := &op{n: 4}
	if err := g.Do(context.Background(), late); err != nil || !late.alone {
		t.Fatalf("call queued behind the hung slot: %+v %v", late, err)
	}
	close(gate)
	hung.Wait()
	g.Wait()
	// The regular slot is free again: a call runs at once, no stall.
	stalls := g.Stalls()
	if err := g.Do(context.Background(), &op{n: 5}); err != nil || g.Stalls() != stalls {
		t.Fatalf("after the hang: %v, %d stalls, want %d", err, g.Stalls(), stalls)
	}
}

// A call that gives up while it is first in the queue leaves the queue at
// once and never runs; the call queued behind it runs alone.
func TestFirstQueuedCallLeaving(t *testing.T) {
	gate := make(chan struct{})
	var l runLog
	g := gatedGroup(4, gate, &l)
	q := queueTwo(t, g)
	q.leave(t)
	if _, pending := g.Queue(); pending != 1 {
		t.Errorf("%d calls queued after the first left, want 1", pending)
	}

	close(gate)
	q.wg.Wait()
	g.Wait()
	if q.leaving.alone || q.leaving.batch != 0 {
		t.Errorf("the call that left ran: %+v", q.leaving)
	}
	if q.stayErr != nil || !q.stay.alone {
		t.Errorf("the call that stayed: %+v %v, want it run alone", q.stay, q.stayErr)
	}
}

// Unstall opens at most its number of extra slots: while the one extra
// slot allowed is busy, a call queued behind the hung regular slot waits
// for it, however long the queue stalls, and runs once it is free. The
// test runs in a synctest bubble, whose clock moves only when every
// goroutine waits, so the stall checks happen at known instants.
func TestUnstallBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stall = time.Second
		hang, held := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		var started []int
		g := groupcommit.New(1, 8,
			func(ctx context.Context, o *op) {
				mu.Lock()
				started = append(started, o.n)
				mu.Unlock()
				switch o.n {
				case 0:
					<-hang
				case 1:
					<-held
				}
				o.alone = true
			},
			func(ctx context.Context, ops []*op) { t.Errorf("a batch of %d ran", len(ops)) })
		g.Unstall(stall, 1)
		ran := func() []int {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(started)
		}
		var wg sync.WaitGroup
		release := sync.OnceFunc(func() { close(held) })
		defer func() {
			release()
			close(hang)
			wg.Wait()
			g.Wait()
		}()

		wg.Go(func() { _ = g.Do(context.Background(), &op{n: 0}) })
		synctest.Wait()
		wg.Go(func() { _ = g.Do(context.Background(), &op{n: 1}) })
		synctest.Wait()
		time.Sleep(stall * 3 / 2)
		synctest.Wait()
		if got := ran(); !slices.Equal(got, []int{0, 1}) || g.Stalls() != 1 {
			t.Fatalf("after one stall: started %v, %d stalls; want [0 1], 1", got, g.Stalls())
		}

		// The extra slot is busy with call 1: call 2 waits, however long.
		last := &op{n: 2}
		wg.Go(func() { _ = g.Do(context.Background(), last) })
		synctest.Wait()
		time.Sleep(10 * stall)
		synctest.Wait()
		if got := ran(); !slices.Equal(got, []int{0, 1}) || g.Stalls() != 1 {
			t.Errorf("with the extra slot busy: started %v, %d stalls; want [0 1], 1", got, g.Stalls())
		}
		if free, pending := g.Queue(); free != 0 || pending != 1 {
			t.Errorf("queue %d free, %d pending; want 0, 1", free, pending)
		}

		// Once the extra slot is free again, the next check gives it call 2.
		release()
		synctest.Wait()
		time.Sleep(stall)
		synctest.Wait()
		if !last.alone || g.Stalls() != 2 {
			t.Errorf("after the extra slot closed: %+v, %d stalls; want call 2 run, 2 stalls", last, g.Stalls())
		}
	})
}

// gatedOp is an operation whose work waits for gate, when it has one.
type gatedOp struct {
	n    int
	gate chan struct{}
	done atomic.Bool // read while the group may run it
}

// The stall check keeps watching the queue as long as Unstall is on: a
// queue that moved and then hung gets an extra slot once it has not moved
// for the while; so does a call queued after the queue emptied; and so
// do calls queued before Unstall was turned off and on again. While it is
// off, queued calls wait for a regular slot. The test runs in a synctest
// bubble, whose clock moves only when every goroutine waits, so the stall
// checks happen at known instants.
func TestUnstallKeepsWatching(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stall = time.Second
		g := groupcommit.New(1, 8,
			func(ctx context.Context, o *gatedOp) {
				if o.gate != nil {
					<-o.gate
				}
				o.done.Store(true)
			},
			func(ctx context.Context, ops []*gatedOp) {
				for _, o := range ops {
					o.done.Store(true)
				}
			})
		g.Unstall(stall, 1)
		var wg sync.WaitGroup
		do := func(o *gatedOp) {
			wg.Go(func() { _ = g.Do(context.Background(), o) })
			synctest.Wait()
		}
		wait := func(d time.Duration) {
			time.Sleep(d)
			synctest.Wait()
		}

		// a runs and b queues behind it; each stall check then finds that
		// the regular slot moved (b, then c, take it in turn), and opens
		// nothing, until c hangs there: d, queued behind c, gets an extra
		// slot once the slot has not moved for a while.
		a := &gatedOp{n: 1, gate: make(chan struct{})}
		b := &gatedOp{n: 2, gate: make(chan struct{})}
		c := &gatedOp{n: 3, gate: make(chan struct{})}
		d := &gatedOp{n: 4}
		defer func() {
			close(c.gate)
			wg.Wait()
			g.Wait()
		}()
		do(a)
		do(b)
		wait(stall * 3 / 4)
		close(a.gate)
		synctest.Wait()
		do(c)
		wait(stall * 3 / 4)
		close(b.gate)
		synctest.Wait()
		do(d)
		wait(stall * 3 / 4)
		if d.done.Load() || g.Stalls() != 0 {
			t.Fatalf("while the queue moves: d run %v, %d stalls; want d queued, 0 stalls", d.done.Load(), g.Stalls())
		}
		wait(stall)
		if !d.done.Load() || g.Stalls() != 1 {
			t.Fatalf("once the queue hangs: d run %v, %d stalls; want d run, 1 stall", d.done.Load(), g.Stalls())
		}

		// The queue is empty now; a call queued later is watched again.
		wait(2 * stall)
		e := &gatedOp{n: 5}
		do(e)
		wait(2 * stall)
		if !e.done.Load() || g.Stalls() != 2 {
			t.Fatalf("a call queued after the queue emptied: run %v, %d stalls; want it run, 2 stalls", e.done.Load(), g.Stalls())
		}

		// Turned off while f waits: f waits for the regular slot.
		wait(2 * stall)
		f := &gatedOp{n: 6}
		do(f)
		g.Unstall(0, 0)
		wait(10 * stall)
		if _, pending := g.Queue(); f.done.Load() || pending != 1 || g.Stalls() != 2 {
			t.Fatalf("with Unstall off: f run %v, %d pending, %d stalls; want f queued, 2 stalls", f.done.Load(), pending, g.Stalls())
		}
		// Turned on again: f and h leave in one extra slot.
		g.Unstall(stall, 1)
		h := &gatedOp{n: 7}
		do(h)
		wait(2 * stall)
		if !f.done.Load() || !h.done.Load() || g.Stalls() != 3 {
			t.Errorf("with Unstall on again: f run %v, h run %v, %d stalls; want both run, 3 stalls", f.done.Load(), h.done.Load(), g.Stalls())
		}
	})
}
