package maintenance_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// A reap pass goes on, batch after batch, while a batch comes back full,
// whether it deleted expired records or closed abandoned ones: a backlog
// larger than one batch is cleared in one pass.
func TestReapPassClearsABacklog(t *testing.T) {
	t.Parallel()
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{TTL: time.Hour})
	mt := m.Maintainer(maintenance.Config{BatchSize: 1})
	for _, k := range []string{"done1", "stuck1", "done2", "stuck2"} {
		m.Send(k, strings.HasPrefix(k, "stuck"))
	}
	m.Clock.Advance(2 * time.Hour)
	res, err := mt.ReapOnce(context.Background())
	if err != nil || res.Deleted != 2 || res.Abandoned != 2 {
		t.Fatalf("reap: %+v %v, want 2 deleted and 2 abandoned in one pass", res, err)
	}
	for _, k := range []string{"stuck1", "stuck2"} {
		if s := m.State(k); s != store.StateCompleted {
			t.Errorf("%s after the pass: %q, want its timeout answer stored", k, s)
		}
	}
}

// An expiry pass goes on while a batch comes back full: every asynchronous
// request that no worker claimed in time gets its timeout answer, however
// many there are.
func TestExpirePendingPassClearsABacklog(t *testing.T) {
	t.Parallel()
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	q, _ := store.AsQueue(m.Store)
	if q == nil {
		t.Fatal("the memory store keeps no pending requests")
	}
	for _, k := range []string{"r1", "r2", "r3"} {
		p := store.PendingParams{
			ReserveParams: store.ReserveParams{Scope: enginetest.Scope, Key: k, Fingerprint: "fp-" + k, Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown},
			Request:       store.PendingRequest{Queue: "reports", Method: "POST", Target: "/v1/reports"},
		}
		if res, err := q.ReservePending(context.Background(), p); err != nil || res.Outcome != store.Created {
			t.Fatalf("ReservePending %s: %+v %v", k, res, err)
		}
	}
	m.Clock.Advance(2 * time.Minute)
	mt := m.Maintainer(maintenance.Config{BatchSize: 1})
	if n, err := mt.ExpirePendingOnce(context.Background()); err != nil || n != 3 {
		t.Fatalf("expire: %d %v, want 3 in one pass", n, err)
	}
	for _, k := range []string{"r1", "r2", "r3"} {
		if s := m.State(k); s != store.StateCompleted {
			t.Errorf("%s after the pass: %q, want its timeout answer stored", k, s)
		}
	}
}

// The Observer counts a store call as failed when the store failed, and
// not when it answered, also when the answer is about the record (a
// settlement of a record that is not unknown): the store errors metric
// is what an operator alerts on.
func TestStoreCallFailuresReported(t *testing.T) {
	t.Parallel()
	obs := &obstest.Recorder{}
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	healthy := m.Maintainer(maintenance.Config{Observer: obs})
	broken, err := maintenance.New(brokenStore{m.Store}, maintenance.Config{Observer: obs, Clock: m.Clock})
	if err != nil {
		t.Fatal(err)
	}
	m.Send("done", false)
	rec, err := m.Record("done")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broken.SweepOnce(context.Background()); !errors.Is(err, idem.ErrStore) {
		t.Fatalf("sweep over a broken store: %v", err)
	}
	if _, err := healthy.ReapOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	err = healthy.Settle(context.Background(), rec.Scope, rec.Key, rec.Fence, maintenance.Resolution{Outcome: maintenance.DidNotHappen})
	if !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("settling a completed record: %v", err)
	}
	calls, failed := obs.StoreCalls(), obs.StoreErrors()
	for op, want := range map[string]int64{"sweep": 1, "reap": 0, "resolve": 0} {
		if calls[op] != 1 || failed[op] != want {
			t.Errorf("%s: %d calls, %d failed; want 1 call, %d failed", op, calls[op], failed[op], want)
		}
	}
}

// With BatchTimeout no longer than twice StoreTimeout, the Resolver's time
// ends half the batch before the batch does, not StoreTimeout before it:
// StoreTimeout would leave it no time at all.
func TestResolverGetsHalfAShortBatch(t *testing.T) {
	t.Parallel()
	var (
		deadline time.Time
		asked    bool
	)
	probe := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
		deadline, asked = ctx.Deadline()
		return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
	})
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{Resolver: probe, StoreTimeout: 2 * time.Hour, BatchTimeout: 2 * time.Hour}, idem.Config{})
	m.Unknown("k")
	before := time.Now()
	res, err := m.M.ReconcileOnce(context.Background())
	if err != nil || res != (maintenance.ReconcileResult{Resolved: 1}) {
		t.Fatalf("reconcile: %+v %v, want the record resolved", res, err)
	}
	if !asked || deadline.Before(before.Add(time.Hour)) || deadline.After(time.Now().Add(time.Hour)) {
		t.Fatalf("the Resolver's deadline %v (set %v), want an hour after the pass began", deadline, asked)
	}
}

// A Resolver that fails with time to spare has made its attempt: the
// record is deferred, and the provider is not asked about it again in the
// same pass.
func TestResolverErrorAskedOncePerPass(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	resolver := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
		if calls.Add(1) == 1 {
			return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
		}
		return maintenance.Resolution{}, errors.New("provider answered 500")
	})
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{Resolver: resolver}, idem.Config{})
	m.Unknown("a", "b")
	res, err := m.M.ReconcileOnce(context.Background())
	if err != nil || res != (maintenance.ReconcileResult{Resolved: 1, Deferred: 1}) {
		t.Fatalf("reconcile: %+v %v, want one resolved and one deferred", res, err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the Resolver was asked %d times, want once per record", n)
	}
}

// Limits that are met exactly are accepted: a reconciliation backoff that
// does not grow, a batch as long as one store call.
func TestConfigEqualLimits(t *testing.T) {
	t.Parallel()
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	for _, cfg := range []maintenance.Config{
		{ReconcileBackoff: time.Minute, ReconcileMaxBackoff: time.Minute},
		{StoreTimeout: time.Minute, BatchTimeout: time.Minute},
	} {
		if _, err := maintenance.New(m.Store, cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

// A settlement whose outcome is none of the named ones is refused with an
// error that names the value it got.
func TestSettleNamesAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	m.Unknown("k")
	rec, err := m.Record("k")
	if err != nil {
		t.Fatal(err)
	}
	err = m.M.Settle(context.Background(), rec.Scope, rec.Key, rec.Fence, maintenance.Resolution{Outcome: maintenance.RunAgain + 1})
	if err == nil || !strings.HasSuffix(err.Error(), "(got Outcome(4))") {
		t.Fatalf("err %v, want the outcome named", err)
	}
	if s := m.State("k"); s != store.StateUnknown {
		t.Errorf("k after a refused settlement: %s", s)
	}
}
