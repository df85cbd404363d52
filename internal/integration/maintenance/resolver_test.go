package maintenance_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// misbehaving answers DidNotHappen about every record but the one named
// bad, for which it calls bad's behaviour instead.
func misbehaving(bad string, behave func(ctx context.Context) (maintenance.Resolution, error)) maintenance.Resolver {
	return maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
		if r.Key == bad {
			return behave(ctx)
		}
		return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
	})
}

// reconcileAround runs one pass over an unknown record the resolver
// misbehaves about, swept before a second, healthy one. The pass must
// return, settle the healthy record, and count one failed attempt on the
// other, whose reason is kept for an operator.
func reconcileAround(t *testing.T, ns enginetest.Store, cfg maintenance.Config, resolver maintenance.Resolver, reason string) {
	t.Helper()
	cfg.Resolver = resolver
	m := enginetest.NewMaint(t, ns, cfg, idem.Config{})
	m.Unknown("bad")
	m.Unknown("good") // due after bad: asked about second
	type result struct {
		res maintenance.ReconcileResult
		err error
		pan any
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { r.pan = recover(); done <- r }()
		r.res, r.err = m.M.ReconcileOnce(context.Background())
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("ReconcileOnce did not return")
	}
	if r.pan != nil {
		t.Fatalf("ReconcileOnce panicked: %v", r.pan)
	}
	if r.err != nil || r.res != (maintenance.ReconcileResult{Resolved: 1, Deferred: 1}) {
		t.Fatalf("reconcile: %+v %v, want the good record resolved and the bad one deferred", r.res, r.err)
	}
	if s := m.State("good"); s != store.StateFailedRetryable {
		t.Fatalf("good record: %s", s)
	}
	rec, err := m.Record("bad")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StateUnknown || rec.ReconcileAttempts != 1 || !strings.Contains(rec.LastError, reason) {
		t.Fatalf("bad record: %s, %d attempts, %q; want unknown, 1 attempt, a reason saying %q",
			rec.State, rec.ReconcileAttempts, rec.LastError, reason)
	}
}

// A Resolver that panics on one record (a provider's malformed answer) is
// a failed attempt on that record: it neither brings down the process that
// runs the reconciler (every instance, again at every pass) nor stops the
// records after it.
func TestReconcilerSurvivesAPanickingResolver(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			reconcileAround(t, ns, maintenance.Config{}, misbehaving("bad", func(context.Context) (maintenance.Resolution, error) {
				panic("provider answer has no status")
			}), "provider answer has no status")
		})
	}
}

// A Resolver that waits on a provider that never answers, until its
// context ends, must still leave time to record the attempt: otherwise the
// attempt is never counted, the record is never dead-lettered, and as the
// oldest due record it takes every batch's time, so that no unknown record
// is ever reconciled again.
func TestReconcilerCountsAResolverThatTimesOut(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			cfg := maintenance.Config{StoreTimeout: 2 * time.Second, BatchTimeout: 3 * time.Second}
			reconcileAround(t, ns, cfg, misbehaving("bad", func(ctx context.Context) (maintenance.Resolution, error) {
				<-ctx.Done()
				return maintenance.Resolution{}, ctx.Err()
			}), "deadline")
		})
	}
}

// A Resolver that ignores its context (a provider client without a
// timeout) holds the reconciler no longer than its batch allows: the
// reconciler stops waiting for it, counts the attempt and goes on; Stop
// would otherwise wait for it for ever.
func TestReconcilerStopsWaitingForAHungResolver(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			hung := make(chan struct{})
			t.Cleanup(func() { close(hung) })
			cfg := maintenance.Config{StoreTimeout: 2 * time.Second, BatchTimeout: 3 * time.Second}
			reconcileAround(t, ns, cfg, misbehaving("bad", func(context.Context) (maintenance.Resolution, error) {
				<-hung
				return maintenance.Resolution{}, errors.New("released")
			}), "deadline")
		})
	}
}

// A record asked about when the records before it took most of the batch's
// time did not get a fair attempt: its Resolver's time running out is not
// counted against it (repeated, it would dead-letter a record whose
// provider is merely slow). The next batch asks it first.
func TestReconcilerAttemptLateInABatchIsNotCounted(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			slow := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
				select {
				case <-time.After(1500 * time.Millisecond): // within the 2s a batch of 3s leaves it
					return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
				case <-ctx.Done():
					return maintenance.Resolution{}, ctx.Err()
				}
			})
			m := enginetest.NewMaint(t, ns, maintenance.Config{Resolver: slow, StoreTimeout: time.Second, BatchTimeout: 3 * time.Second}, idem.Config{})
			m.Unknown("first")
			m.Unknown("second")
			res, err := m.M.ReconcileOnce(context.Background())
			if err != nil || res != (maintenance.ReconcileResult{Resolved: 2}) {
				t.Fatalf("reconcile: %+v %v, want both resolved, the second in a batch of its own", res, err)
			}
		})
	}
}
