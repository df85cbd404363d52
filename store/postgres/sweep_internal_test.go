package postgres

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// TestSweepWalkPassesLockedRows runs the sweep with a walk bound of two
// leases while a caller's transaction holds the rows of the two leases
// that ended first: the mark must pass them when the walk stops at its
// bound, or every later sweep would walk those same two rows and sweep
// nothing. Once the transaction rolls back, the rows the mark passed are
// left in progress with their lease ended: a retry's Reserve turns its
// record unknown, and the reaper closes the other past its expiry.
func TestSweepWalkPassesLockedRows(t *testing.T) {
	const (
		lease = time.Second
		grace = 2 * time.Second
		ttl   = time.Hour
		walk  = 2
	)
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	clock := storetest.NewClock()
	s, err := Open(ctx, url, Config{Schema: pgdb.Schema(t, url), Clock: clock.Now, MaxBatches: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	params := func(key string) store.ReserveParams {
		return store.ReserveParams{Scope: "s", Key: key, Fingerprint: "fp-" + key, Lease: lease, TTL: ttl,
			LeasePolicy: store.LeaseUnknown}
	}
	recs := map[string]store.Record{}
	for _, k := range []string{"a1", "a2", "b", "c", "d"} {
		r, err := s.Reserve(ctx, params(k))
		if err != nil || r.Outcome != store.Created {
			t.Fatalf("reserve %s: %v %v", k, r.Outcome, err)
		}
		recs[k] = r.Record
		clock.Advance(time.Millisecond) // leases ending in key order
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, k := range []string{"a1", "a2"} {
		r := recs[k]
		err := s.CompleteTx(ctx, tx, store.CompleteParams{
			FenceParams: store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence},
			Response:    store.Response{Status: http.StatusOK},
		})
		if err != nil {
			t.Fatalf("CompleteTx %s: %v", k, err)
		}
	}
	clock.Advance(lease + grace)

	sweep := func() []string {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		got, err := s.queryIndexed(sctx, s.q.sweepLock, s.q.sweep,
			[]any{10, s.now(), grace.Microseconds(), walk}, collectRecords)
		if err != nil {
			t.Fatalf("sweep: %v", err)
		}
		keys := make([]string, len(got))
		for i, r := range got {
			keys[i] = r.Key
		}
		return keys
	}
	var swept []string
	for i := 0; i < 6; i++ {
		swept = append(swept, sweep()...)
	}
	if len(swept) != 3 || swept[0] != "b" || swept[1] != "c" || swept[2] != "d" {
		t.Fatalf("sweeps while a1 and a2 are locked: %v, want [b c d]", swept)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sweep(); len(got) != 0 {
		t.Fatalf("sweep after the rollback: %v, want none (the mark passed a1 and a2)", got)
	}

	r, err := s.Reserve(ctx, params("a1"))
	if err != nil || r.Record.State != store.StateUnknown || r.Record.LastError != "lease_expired" {
		t.Fatalf("retry of a1: %v %s %q %v, want unknown lease_expired", r.Outcome, r.Record.State, r.Record.LastError, err)
	}
	if a2, err := s.Get(ctx, "s", "a2"); err != nil || a2.State != store.StateInProgress {
		t.Fatalf("a2 before its expiry: %s %v, want in_progress", a2.State, err)
	}
	clock.Advance(ttl)
	res, err := s.Reap(ctx, store.ReapParams{Limit: 10, Abandoned: store.Response{Status: http.StatusGatewayTimeout},
		AbandonedTTL: ttl, Grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := s.Get(ctx, "s", "a2")
	if err != nil || a2.State != store.StateCompleted || a2.LastError != "abandoned" {
		t.Fatalf("a2 after the reap (%+v): %s %q %v, want completed abandoned", res, a2.State, a2.LastError, err)
	}
}
