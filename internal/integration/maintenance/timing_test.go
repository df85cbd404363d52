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

// The delay after each unsettled attempt starts at ReconcileBackoff,
// doubles, and stays at ReconcileMaxBackoff once it reached it.
func TestReconcileBackoffDoublesUpToTheCap(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			m := enginetest.NewMaint(t, ns, maintenance.Config{Resolver: enginetest.StillUnknown, ReconcileBackoff: time.Minute,
				ReconcileMaxBackoff: 5 * time.Minute, MaxReconcileAttempts: 100}, idem.Config{})
			m.Unknown("k")
			var delays []time.Duration
			for range 6 {
				m.ReconcileDue("k", maintenance.ReconcileResult{Deferred: 1})
				rec, err := m.Record("k")
				if err != nil {
					t.Fatal(err)
				}
				delays = append(delays, rec.ReconcileAfter.Sub(m.Clock.Now()))
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
				return enginetest.StillUnknown(ctx, r)
			})
			m := enginetest.NewMaint(t, ns, maintenance.Config{Resolver: counting, ReconcileBackoff: time.Minute,
				ReconcileMaxBackoff: time.Minute, MaxReconcileAttempts: 4}, idem.Config{})
			m.Unknown("k")
			for attempt := 1; attempt < 4; attempt++ {
				m.ReconcileDue("k", maintenance.ReconcileResult{Deferred: 1})
				if rec, _ := m.Record("k"); rec.DeadLettered() || rec.ReconcileAttempts != attempt {
					t.Fatalf("after attempt %d: dead-lettered %v, attempts %d", attempt, rec.DeadLettered(), rec.ReconcileAttempts)
				}
			}
			m.ReconcileDue("k", maintenance.ReconcileResult{DeadLettered: 1})
			rec, err := m.Record("k")
			if err != nil || !rec.DeadLettered() || rec.State != store.StateUnknown {
				t.Fatalf("after the last attempt: %+v %v", rec, err)
			}
			m.Clock.Advance(365 * 24 * time.Hour)
			if res, err := m.M.ReconcileOnce(context.Background()); err != nil || res != (maintenance.ReconcileResult{}) {
				t.Fatalf("a dead letter was asked about again: %+v %v", res, err)
			}
			if asked != 4 {
				t.Fatalf("the resolver was asked %d times, want 4", asked)
			}
		})
	}
}
