package maintenance_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// Each loop first waits a random part of its interval, from zero up to
// (not including) the interval, then a whole interval between passes; a
// pass pauses from half of BatchPause up to (not including) BatchPause
// between two batches. A random source pinned to its extremes shows the
// bounds.
func TestJitterBounds(t *testing.T) {
	ns := enginetest.Memory
	for _, extreme := range []struct {
		name string
		draw func(n int64) int64
	}{
		{"lowest", func(int64) int64 { return 0 }},
		{"highest", func(n int64) int64 { return n - 1 }},
	} {
		t.Run(extreme.name, func(t *testing.T) {
			m := enginetest.NewMaint(t, ns, maintenance.Config{}, idem.Config{})
			mt := m.Maintainer(maintenance.Config{SweepInterval: 40 * time.Second, ReapInterval: time.Hour,
				ReconcileInterval: 3 * time.Minute, Resolver: enginetest.StillUnknown, BatchSize: 1, BatchPause: 2 * time.Second})
			maintenance.SetRand(mt, extreme.draw)
			pick := func(lo, hi time.Duration) time.Duration {
				if extreme.draw(2) == 0 {
					return lo
				}
				return hi - 1
			}

			// The pause between batches, in a one-off pass.
			m.Send("a", true)
			m.Send("b", true)
			m.Clock.Advance(time.Minute)
			m.Clock.Sleeps()
			if n, err := mt.SweepOnce(context.Background()); err != nil || n != 2 {
				t.Fatalf("sweep: %d %v", n, err)
			}
			// Batches of one: a, b, and an empty one that ends the pass.
			want := []time.Duration{pick(time.Second, 2*time.Second), pick(time.Second, 2*time.Second)}
			if got := m.Clock.Sleeps(); !slices.Equal(got, want) {
				t.Fatalf("pauses %v, want %v", got, want)
			}

			// The first wait of each loop.
			m.Clock.Manual = true
			if err := mt.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer mt.Stop(context.Background())
			var first []time.Duration
			for range 3 {
				first = append(first, m.Clock.NextPark(t))
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
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	m.Clock.Manual = true
	mt := m.Maintainer(maintenance.Config{SweepInterval: 40 * time.Second, ReapInterval: 24 * time.Hour})
	maintenance.SetRand(mt, func(n int64) int64 { return n / 2 })
	m.Send("z1", true)
	if err := mt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer mt.Stop(context.Background())
	if got := []time.Duration{m.Clock.NextPark(t), m.Clock.NextPark(t)}; !slices.Contains(got, 20*time.Second) {
		t.Fatalf("first waits %v, want the sweeper's 20s among them", got)
	}
	// At 20s the lease (30s) holds: the pass sweeps nothing.
	m.Clock.Advance(20 * time.Second)
	if d := m.Clock.NextPark(t); d != 40*time.Second {
		t.Fatalf("wait after the first pass: %v, want the interval", d)
	}
	if s := m.State("z1"); s != store.StateInProgress {
		t.Fatalf("z1 swept inside its lease: %s", s)
	}
	// The next pass is due at 60s, not before.
	m.Clock.Advance(40*time.Second - time.Microsecond)
	if n := m.Clock.Pending(); n != 2 {
		t.Fatalf("%d loops wait a microsecond before the second pass, want both", n)
	}
	m.Clock.Advance(time.Microsecond)
	if d := m.Clock.NextPark(t); d != 40*time.Second {
		t.Fatalf("wait after the second pass: %v", d)
	}
	if s := m.State("z1"); s != store.StateUnknown {
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
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{Resolver: probe, BatchTimeout: 7 * time.Hour}, idem.Config{})
	m.Unknown("k")
	before := time.Now()
	if _, err := m.M.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !ok || deadline.Before(before) || deadline.After(time.Now().Add(7*time.Hour)) || deadline.Before(before.Add(6*time.Hour)) {
		t.Fatalf("the batch's deadline %v (set %v), want 7h after the pass began", deadline, ok)
	}
}
