package maintenance_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// stillUnknown is a provider that can never tell.
var stillUnknown = maintenance.ResolverFunc(func(context.Context, store.Record) (maintenance.Resolution, error) {
	return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
})

// reconcileDue runs a pass and checks that it asked about the key exactly
// when it was due: not one microsecond (the stores' precision) before.
func (m *maint) reconcileDue(key string, want maintenance.ReconcileResult) {
	m.t.Helper()
	rec, err := m.record(key)
	if err != nil {
		m.t.Fatal(err)
	}
	if wait := rec.ReconcileAfter.Sub(m.clock.Now()); wait > 0 {
		m.clock.Advance(wait - time.Microsecond)
		if res, err := m.m.ReconcileOnce(context.Background()); err != nil || res != (maintenance.ReconcileResult{}) {
			m.t.Fatalf("pass a microsecond before %s was due: %+v %v", key, res, err)
		}
		m.clock.Advance(time.Microsecond)
	}
	if res, err := m.m.ReconcileOnce(context.Background()); err != nil || res != want {
		m.t.Fatalf("pass when %s was due: %+v %v, want %+v", key, res, err, want)
	}
}

// The delay after each unsettled attempt starts at ReconcileBackoff,
// doubles, and stays at ReconcileMaxBackoff once it reached it.
func TestReconcileBackoffDoublesUpToTheCap(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			m := newMaint(t, ns, maintenance.Config{Resolver: stillUnknown, ReconcileBackoff: time.Minute,
				ReconcileMaxBackoff: 5 * time.Minute, MaxReconcileAttempts: 100}, idem.Config{})
			m.unknown("k")
			var delays []time.Duration
			for range 6 {
				m.reconcileDue("k", maintenance.ReconcileResult{Deferred: 1})
				rec, err := m.record("k")
				if err != nil {
					t.Fatal(err)
				}
				delays = append(delays, rec.ReconcileAfter.Sub(m.clock.Now()))
			}
			want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute}
			if !slices.Equal(delays, want) {
				t.Fatalf("delays after each attempt %v, want %v", delays, want)
			}
		})
	}
}

// The MaxReconcileAttempts-th unsettled attempt dead-letters the record,
// not one before; no pass asks about it again, however long it waits.
func TestDeadLetterAtMaxReconcileAttempts(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			asked := 0
			counting := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
				asked++
				return stillUnknown(ctx, r)
			})
			m := newMaint(t, ns, maintenance.Config{Resolver: counting, ReconcileBackoff: time.Minute,
				ReconcileMaxBackoff: time.Minute, MaxReconcileAttempts: 4}, idem.Config{})
			m.unknown("k")
			for attempt := 1; attempt < 4; attempt++ {
				m.reconcileDue("k", maintenance.ReconcileResult{Deferred: 1})
				if rec, _ := m.record("k"); rec.DeadLettered() || rec.ReconcileAttempts != attempt {
					t.Fatalf("after attempt %d: dead-lettered %v, attempts %d", attempt, rec.DeadLettered(), rec.ReconcileAttempts)
				}
			}
			m.reconcileDue("k", maintenance.ReconcileResult{DeadLettered: 1})
			rec, err := m.record("k")
			if err != nil || !rec.DeadLettered() || rec.State != store.StateUnknown {
				t.Fatalf("after the last attempt: %+v %v", rec, err)
			}
			m.clock.Advance(365 * 24 * time.Hour)
			if res, err := m.m.ReconcileOnce(context.Background()); err != nil || res != (maintenance.ReconcileResult{}) {
				t.Fatalf("a dead letter was asked about again: %+v %v", res, err)
			}
			if asked != 4 {
				t.Fatalf("the resolver was asked %d times, want 4", asked)
			}
		})
	}
}

// Each loop first waits a random part of its interval, from zero up to
// (not including) the interval, then a whole interval between passes; a
// pass pauses from half of BatchPause up to (not including) BatchPause
// between two batches. A random source pinned to its extremes shows the
// bounds.
func TestJitterBounds(t *testing.T) {
	ns := realStores(t)[0]
	for _, extreme := range []struct {
		name string
		draw func(n int64) int64
	}{
		{"lowest", func(int64) int64 { return 0 }},
		{"highest", func(n int64) int64 { return n - 1 }},
	} {
		t.Run(extreme.name, func(t *testing.T) {
			m := newMaint(t, ns, maintenance.Config{}, idem.Config{})
			mt := m.maintainer(maintenance.Config{SweepInterval: 40 * time.Second, ReapInterval: time.Hour,
				ReconcileInterval: 3 * time.Minute, Resolver: stillUnknown, BatchSize: 1, BatchPause: 2 * time.Second})
			maintenance.SetRand(mt, extreme.draw)
			pick := func(lo, hi time.Duration) time.Duration {
				if extreme.draw(2) == 0 {
					return lo
				}
				return hi - 1
			}

			// The pause between batches, in a one-off pass.
			m.send("a", true)
			m.send("b", true)
			m.clock.Advance(time.Minute)
			m.clock.sleeps()
			if n, err := mt.SweepOnce(context.Background()); err != nil || n != 2 {
				t.Fatalf("sweep: %d %v", n, err)
			}
			// Batches of one: a, b, and an empty one that ends the pass.
			want := []time.Duration{pick(time.Second, 2*time.Second), pick(time.Second, 2*time.Second)}
			if got := m.clock.sleeps(); !slices.Equal(got, want) {
				t.Fatalf("pauses %v, want %v", got, want)
			}

			// The first wait of each loop.
			m.clock.manual = true
			if err := mt.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer mt.Stop(context.Background())
			var first []time.Duration
			for range 3 {
				first = append(first, m.clock.nextPark(t))
			}
			slices.Sort(first)
			want = []time.Duration{pick(0, 40*time.Second), pick(0, 3*time.Minute), pick(0, time.Hour)}
			if !slices.Equal(first, want) {
				t.Fatalf("first waits %v, want %v", first, want)
			}
		})
	}
}

// A running sweeper passes once its first wait is over, then every
// SweepInterval.
func TestLoopCadence(t *testing.T) {
	t.Parallel()
	m := newMaint(t, realStores(t)[0], maintenance.Config{}, idem.Config{})
	m.clock.manual = true
	mt := m.maintainer(maintenance.Config{SweepInterval: 40 * time.Second, ReapInterval: 24 * time.Hour})
	maintenance.SetRand(mt, func(n int64) int64 { return n / 2 })
	m.send("z1", true)
	if err := mt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer mt.Stop(context.Background())
	if got := []time.Duration{m.clock.nextPark(t), m.clock.nextPark(t)}; !slices.Contains(got, 20*time.Second) {
		t.Fatalf("first waits %v, want the sweeper's 20s among them", got)
	}
	// At 20s the lease (30s) holds: the pass sweeps nothing.
	m.clock.Advance(20 * time.Second)
	if d := m.clock.nextPark(t); d != 40*time.Second {
		t.Fatalf("wait after the first pass: %v, want the interval", d)
	}
	if s := m.state("z1"); s != store.StateInProgress {
		t.Fatalf("z1 swept inside its lease: %s", s)
	}
	// The next pass is due at 60s, not before.
	m.clock.Advance(40*time.Second - time.Microsecond)
	if n := m.clock.pending(); n != 2 {
		t.Fatalf("%d loops wait a microsecond before the second pass, want both", n)
	}
	m.clock.Advance(time.Microsecond)
	if d := m.clock.nextPark(t); d != 40*time.Second {
		t.Fatalf("wait after the second pass: %v", d)
	}
	if s := m.state("z1"); s != store.StateUnknown {
		t.Fatalf("z1 after the second pass: %s", s)
	}
}

// Every batch runs under BatchTimeout: the Resolver's context ends by it.
func TestBatchTimeout(t *testing.T) {
	t.Parallel()
	var deadline time.Time
	var ok bool
	probe := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
		deadline, ok = ctx.Deadline()
		return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
	})
	m := newMaint(t, realStores(t)[0], maintenance.Config{Resolver: probe, BatchTimeout: 7 * time.Hour}, idem.Config{})
	m.unknown("k")
	before := time.Now()
	if _, err := m.m.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !ok || deadline.Before(before) || deadline.After(time.Now().Add(7*time.Hour)) || deadline.Before(before.Add(6*time.Hour)) {
		t.Fatalf("the batch's deadline %v (set %v), want 7h after the pass began", deadline, ok)
	}
}
