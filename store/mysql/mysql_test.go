package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	baseConfig(t)
	storetest.Run(t, storetest.Harness{
		NewDatabase: func(t *testing.T) storetest.Opener {
			cfg := newDatabase(t)
			return func(t *testing.T, clock store.Clock) store.Store {
				return openStore(t, cfg, clock)
			}
		},
		Durable: true,
		Shared:  true,
	})
}

// TestConformanceNew runs the suite on stores made by New on a plain pool
// (no multiStatements, no interpolateParams): Reserve's fallback
// transaction and prepared statements.
func TestConformanceNew(t *testing.T) {
	t.Parallel()
	baseConfig(t)
	storetest.Run(t, storetest.Harness{
		NewDatabase: func(t *testing.T) storetest.Opener {
			cfg := newDatabase(t)
			cfg.MultiStatements = false
			cfg.InterpolateParams = false
			return func(t *testing.T, clock store.Clock) store.Store {
				db, err := sql.Open("mysql", cfg.FormatDSN())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				db.SetMaxOpenConns(testMaxConns)
				s, err := New(t.Context(), db, Config{Clock: clock})
				if err != nil {
					t.Fatal(err)
				}
				if s.batch {
					t.Fatal("New chose the batch on a pool without multiStatements")
				}
				return s
			}
		},
		Durable: true,
		Shared:  true,
	})
}

func mustReserve(t *testing.T, s *Store, p store.ReserveParams, want store.ReserveOutcome) store.Record {
	t.Helper()
	res, err := s.Reserve(t.Context(), p)
	if err != nil {
		t.Fatalf("reserve %q: %v", p.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("reserve %q: outcome %v, want %v (record %+v)", p.Key, res.Outcome, want, res.Record)
	}
	return res.Record
}

// TestReserveBranches walks every branch of the Store.Reserve doc comment.
func TestReserveBranches(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t)
	ctx := t.Context()

	t.Run("absent creates a fence from the clock", func(t *testing.T) {
		p := reserveParams("absent")
		now := clock.Now()
		r := mustReserve(t, s, p, store.Created)
		if r.State != store.StateInProgress || r.Fence != now.UnixMicro() || r.Attempts != 1 {
			t.Fatalf("record %+v", r)
		}
		if !r.CreatedAt.Equal(now) || !r.LockedUntil.Equal(now.Add(p.Lease)) || !r.ExpiresAt.Equal(now.Add(p.TTL)) {
			t.Fatalf("times %v %v %v, now %v", r.CreatedAt, r.LockedUntil, r.ExpiresAt, now)
		}
		if r.LockedUntil.Location() != time.UTC {
			t.Fatalf("time not in UTC: %v", r.LockedUntil.Location())
		}
	})

	t.Run("live in_progress is existing", func(t *testing.T) {
		p := reserveParams("live")
		first := mustReserve(t, s, p, store.Created)
		r := mustReserve(t, s, p, store.Existing)
		if r.State != store.StateInProgress || r.Fence != first.Fence {
			t.Fatalf("record %+v", r)
		}
	})

	t.Run("completed replays untouched", func(t *testing.T) {
		p := reserveParams("completed")
		r := mustReserve(t, s, p, store.Created)
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse(`{"id":1}`)}); err != nil {
			t.Fatal(err)
		}
		before := rowVersion(t, s, p.Scope, p.Key)
		clock.Advance(time.Second)
		r = mustReserve(t, s, p, store.Existing)
		if r.State != store.StateCompleted || r.Response == nil || string(r.Response.Body) != `{"id":1}` ||
			r.Response.Header.Get("Content-Type") != "application/json" || r.Response.Status != 201 {
			t.Fatalf("record %+v", r)
		}
		if after := rowVersion(t, s, p.Scope, p.Key); after != before {
			t.Fatalf("replay changed the row: row_version %d -> %d", before, after)
		}
	})

	t.Run("fingerprint mismatch returns the record untouched", func(t *testing.T) {
		p := reserveParams("mismatch")
		mustReserve(t, s, p, store.Created)
		clock.Advance(time.Minute) // lease expired: the mismatch still wins
		other := p
		other.Fingerprint = "something else"
		before := rowVersion(t, s, p.Scope, p.Key)
		r := mustReserve(t, s, other, store.Existing)
		if r.Fingerprint != p.Fingerprint || r.State != store.StateInProgress {
			t.Fatalf("record %+v", r)
		}
		if after := rowVersion(t, s, p.Scope, p.Key); after != before {
			t.Fatal("mismatch changed the row")
		}
	})

	t.Run("terminal past expires_at is recreated with a greater fence", func(t *testing.T) {
		p := reserveParams("expired-terminal")
		p.TTL = time.Hour
		r := mustReserve(t, s, p, store.Created)
		if err := s.Checkpoint(ctx, store.CheckpointParams{FenceParams: fence(r), RecoveryPoint: "charged"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse("x")}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Hour)
		other := p
		other.Fingerprint = "new request"
		other.LeasePolicy = store.LeaseRetry
		now := clock.Now()
		r = mustReserve(t, s, other, store.Created)
		if r.Fence != now.UnixMicro() || r.Attempts != 1 || r.Fingerprint != "new request" || r.Response != nil ||
			r.RecoveryPoint != "" || !r.CompletedAt.IsZero() || r.LeasePolicy != store.LeaseRetry ||
			!r.CreatedAt.Equal(now) || !r.ExpiresAt.Equal(now.Add(p.TTL)) {
			t.Fatalf("record %+v", r)
		}
	})

	t.Run("soft-expired is recreated", func(t *testing.T) {
		p := reserveParams("soft")
		p.TTL = time.Hour
		r := mustReserve(t, s, p, store.Created)
		if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence(r), Error: "503"}); err != nil {
			t.Fatal(err)
		}
		// Only this key is past expiry in the soft reap below: other
		// subtests use 24h TTLs and the clock has moved less than that.
		clock.Advance(time.Hour)
		if _, err := s.Reap(ctx, store.ReapParams{Limit: 100, Soft: true, Abandoned: okResponse("gone"), AbandonedTTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, p.Scope, p.Key)
		if err != nil || got.State != store.StateExpired {
			t.Fatalf("after soft reap: %+v %v", got, err)
		}
		old := r.Fence
		r = mustReserve(t, s, p, store.Created)
		if r.Fence <= old || r.LastError != "" {
			t.Fatalf("record %+v", r)
		}
	})

	t.Run("failed_retryable is reclaimed", func(t *testing.T) {
		p := reserveParams("reclaim")
		r := mustReserve(t, s, p, store.Created)
		if err := s.Checkpoint(ctx, store.CheckpointParams{FenceParams: fence(r), RecoveryPoint: "p1"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence(r), Error: "upstream 503"}); err != nil {
			t.Fatal(err)
		}
		got, _ := s.Get(ctx, p.Scope, p.Key)
		if got.State != store.StateFailedRetryable || got.LastError != "upstream 503" {
			t.Fatalf("after release %+v", got)
		}
		clock.Advance(time.Second)
		now := clock.Now()
		old := r.Fence
		r = mustReserve(t, s, p, store.Reclaimed)
		if r.State != store.StateInProgress || r.Fence != now.UnixMicro() || r.Attempts != 2 || r.LastError != "" ||
			!r.LockedUntil.Equal(now.Add(p.Lease)) || !r.ExpiresAt.Equal(now.Add(p.TTL)) {
			t.Fatalf("record %+v", r)
		}
		// The old holder is fenced out.
		err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: old}, Response: okResponse("late")})
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("stale complete: %v", err)
		}
	})

	t.Run("expired lease under unknown goes to unknown", func(t *testing.T) {
		p := reserveParams("lease-unknown")
		first := mustReserve(t, s, p, store.Created)
		clock.Advance(p.Lease)
		now := clock.Now()
		r := mustReserve(t, s, p, store.Existing)
		if r.State != store.StateUnknown || r.LastError != "lease_expired" || !r.ReconcileAfter.Equal(now) || r.Fence != first.Fence {
			t.Fatalf("record %+v", r)
		}
		r = mustReserve(t, s, p, store.Existing)
		if r.State != store.StateUnknown {
			t.Fatalf("unknown must stay unknown: %+v", r)
		}
	})

	for _, policy := range []store.LeasePolicy{store.LeaseRetry, store.LeaseResume} {
		t.Run("expired lease under "+string(policy)+" is taken over", func(t *testing.T) {
			p := reserveParams("takeover-" + string(policy))
			p.LeasePolicy = policy
			r := mustReserve(t, s, p, store.Created)
			if err := s.Checkpoint(ctx, store.CheckpointParams{FenceParams: fence(r), RecoveryPoint: "step-2"}); err != nil {
				t.Fatal(err)
			}
			clock.Advance(p.Lease + time.Microsecond)
			now := clock.Now()
			old := r.Fence
			r = mustReserve(t, s, p, store.TakenOver)
			if r.Fence != now.UnixMicro() || r.Attempts != 2 || r.RecoveryPoint != "step-2" || r.State != store.StateInProgress ||
				!r.LockedUntil.Equal(now.Add(p.Lease)) {
				t.Fatalf("record %+v", r)
			}
			for name, err := range map[string]error{
				"complete":     s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: old}, Response: okResponse("late")}),
				"release":      s.Release(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: old}}),
				"mark unknown": s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: old}}),
				"checkpoint":   s.Checkpoint(ctx, store.CheckpointParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: old}}),
				"extend":       s.Extend(ctx, store.ExtendParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: old}, Lease: time.Minute}),
			} {
				if !errors.Is(err, store.ErrLeaseLost) {
					t.Errorf("stale %s: %v", name, err)
				}
			}
		})
	}

	t.Run("unknown is existing", func(t *testing.T) {
		p := reserveParams("marked-unknown")
		r := mustReserve(t, s, p, store.Created)
		if err := s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fence(r), Error: "gateway timeout"}); err != nil {
			t.Fatal(err)
		}
		r = mustReserve(t, s, p, store.Existing)
		if r.State != store.StateUnknown || r.LastError != "gateway timeout" {
			t.Fatalf("record %+v", r)
		}
	})
}

func fence(r store.Record) store.FenceParams {
	return store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence}
}

func rowVersion(t *testing.T, s *Store, scope, key string) int64 {
	t.Helper()
	var v int64
	if err := s.DB().QueryRowContext(t.Context(),
		"SELECT row_version FROM idem_records WHERE scope = ? AND `key` = ?", scope, key).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestKeysAreBytes checks that keys and scopes compare byte for byte: no
// case folding, no trailing-space padding, no Unicode normalisation.
func TestKeysAreBytes(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for _, k := range []string{"abc", "ABC", "abc ", "é", "e\u0301"} {
		mustReserve(t, s, reserveParams(k), store.Created)
	}
	p := reserveParams("abc")
	p.Scope = "TENANT|POST /payments"
	mustReserve(t, s, p, store.Created)

	long := reserveParams(strings.Repeat("𝄞", 255)) // 1020 bytes
	long.Scope = strings.Repeat("s", store.MaxScopeBytes)
	long.Fingerprint = strings.Repeat("f", store.MaxFingerprintBytes)
	mustReserve(t, s, long, store.Created)
	got, err := s.Get(t.Context(), long.Scope, long.Key)
	if err != nil || got.Key != long.Key {
		t.Fatalf("long key: %v", err)
	}
	tooLong := reserveParams(strings.Repeat("k", store.MaxKeyBytes+1))
	if _, err := s.Reserve(t.Context(), tooLong); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("over-long key: %v", err)
	}
}

// TestResponseRoundTrip checks bodies byte for byte, nil versus empty, and
// omitted bodies.
func TestResponseRoundTrip(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	binary := make([]byte, 1<<20)
	for i := range binary {
		binary[i] = byte(rand.IntN(256))
	}
	for name, resp := range map[string]store.Response{
		"binary":  {Status: 200, Body: binary},
		"empty":   {Status: 204, Body: []byte{}, Header: map[string][]string{}},
		"nil":     {Status: 204},
		"omitted": {Status: 200, BodyOmitted: true, Header: map[string][]string{"X-A": {"1", "2"}}},
	} {
		r := mustReserve(t, s, reserveParams(name), store.Created)
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: resp}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, r.Scope, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		g := got.Response
		if g == nil || g.Status != resp.Status || g.BodyOmitted != resp.BodyOmitted ||
			!bytes.Equal(g.Body, resp.Body) || (g.Body == nil) != (resp.Body == nil) ||
			(g.Header == nil) != (resp.Header == nil) || len(g.Header) != len(resp.Header) {
			t.Errorf("%s: got %+v", name, g)
		}
	}
}

func TestFencedOperations(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t)
	ctx := t.Context()
	p := reserveParams("k")
	r := mustReserve(t, s, p, store.Created)
	f := fence(r)

	// Same instant, same values: a guarded UPDATE that changes nothing but
	// row_version must still count as a match.
	for range 2 {
		if err := s.Extend(ctx, store.ExtendParams{FenceParams: f, Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if err := s.Checkpoint(ctx, store.CheckpointParams{FenceParams: f, RecoveryPoint: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := s.Get(ctx, p.Scope, p.Key)
	if !got.LockedUntil.Equal(clock.Now().Add(time.Minute)) || got.RecoveryPoint != "a" {
		t.Fatalf("record %+v", got)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: "absent", Fence: 1}, Response: okResponse("x")}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("complete absent: %v", err)
	}
	clock.Advance(time.Minute)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: f, Response: okResponse("ok"), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Get(ctx, p.Scope, p.Key)
	if got.State != store.StateCompleted || !got.CompletedAt.Equal(clock.Now()) || !got.ExpiresAt.Equal(clock.Now().Add(time.Hour)) {
		t.Fatalf("record %+v", got)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: f, Response: okResponse("again")}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second complete: %v", err)
	}
}

func TestMaintenance(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t)
	ctx := t.Context()

	// Three expired leases under unknown, one under retry, one live.
	for i := range 3 {
		mustReserve(t, s, reserveParams(fmt.Sprint("sweep-", i)), store.Created)
	}
	retryP := reserveParams("retry")
	retryP.LeasePolicy = store.LeaseRetry
	mustReserve(t, s, retryP, store.Created)
	clock.Advance(time.Minute)
	mustReserve(t, s, reserveParams("live"), store.Created)

	swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 2})
	if err != nil || len(swept) != 2 {
		t.Fatalf("sweep: %d %v", len(swept), err)
	}
	swept2, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10})
	if err != nil || len(swept2) != 1 {
		t.Fatalf("second sweep: %d %v", len(swept2), err)
	}
	for _, r := range append(swept, swept2...) {
		got, _ := s.Get(ctx, r.Scope, r.Key)
		if r.State != store.StateUnknown || got.State != store.StateUnknown || !got.ReconcileAfter.Equal(clock.Now()) ||
			!r.ReconcileAfter.Equal(got.ReconcileAfter) || got.LastError != "lease_expired" {
			t.Fatalf("swept %+v, stored %+v", r, got)
		}
	}
	if got, _ := s.Get(ctx, retryP.Scope, retryP.Key); got.State != store.StateInProgress {
		t.Fatalf("retry record swept: %+v", got)
	}

	// Reconciliation.
	due, err := s.ListUnknown(ctx, store.ListUnknownParams{DueOnly: true, Limit: 10})
	if err != nil || len(due) != 3 {
		t.Fatalf("list: %d %v", len(due), err)
	}
	if err := s.Defer(ctx, store.DeferParams{FenceParams: fence(due[0]), Attempts: due[0].ReconcileAttempts, Delay: time.Hour, Error: "provider down"}); err != nil {
		t.Fatal(err)
	}
	if due, _ = s.ListUnknown(ctx, store.ListUnknownParams{DueOnly: true, Limit: 10}); len(due) != 2 {
		t.Fatalf("due after defer: %d", len(due))
	}
	all, _ := s.ListUnknown(ctx, store.ListUnknownParams{Limit: 10})
	if len(all) != 3 || all[2].ReconcileAttempts != 1 || all[2].LastError != "provider down" {
		t.Fatalf("all unknown: %+v", all)
	}
	resp := okResponse("settled")
	if err := s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: due[0].Scope, Key: due[0].Key, Fence: due[0].Fence}, To: store.StateCompleted, Response: &resp, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: due[1].Scope, Key: due[1].Key, Fence: due[1].Fence}, To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get(ctx, due[0].Scope, due[0].Key)
	if got.State != store.StateCompleted || string(got.Response.Body) != "settled" || !got.ReconcileAfter.IsZero() {
		t.Fatalf("resolved %+v", got)
	}
	if err := s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: due[0].Scope, Key: due[0].Key, Fence: due[0].Fence}, To: store.StateFailedRetryable}); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("resolve completed: %v", err)
	}
	if err := s.Defer(ctx, store.DeferParams{FenceParams: store.FenceParams{Scope: "nope", Key: "nope", Fence: 1}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("defer absent: %v", err)
	}

	// Reap: everything is past its 24h expiry except the abandoned records'
	// new expiry.
	clock.Advance(25 * time.Hour)
	res, err := s.Reap(ctx, store.ReapParams{Limit: 2, Abandoned: okResponse("timeout"), AbandonedTTL: time.Hour})
	if err != nil || res.Deleted != 2 || res.Abandoned != 0 {
		t.Fatalf("reap 1: %+v %v", res, err)
	}
	res, err = s.Reap(ctx, store.ReapParams{Limit: 10, Abandoned: okResponse("timeout"), AbandonedTTL: time.Hour})
	// Left: 1 unknown (deferred), 1 in_progress under retry, 1 live.
	if err != nil || res.Deleted != 0 || res.Abandoned != 3 {
		t.Fatalf("reap 2: %+v %v", res, err)
	}
	got, _ = s.Get(ctx, retryP.Scope, retryP.Key)
	if got.State != store.StateCompleted || got.LastError != "abandoned" || string(got.Response.Body) != "timeout" {
		t.Fatalf("abandoned %+v", got)
	}
	clock.Advance(time.Hour)
	if res, err = s.Reap(ctx, store.ReapParams{Limit: 10, Abandoned: okResponse("timeout"), AbandonedTTL: time.Hour}); err != nil || res.Deleted != 3 {
		t.Fatalf("reap 3: %+v %v", res, err)
	}
	if err := s.Delete(ctx, store.DeleteParams{Scope: retryP.Scope, Key: retryP.Key}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete reaped: %v", err)
	}
}

// TestServerClock runs with the database's clock.
func TestServerClock(t *testing.T) {
	t.Parallel()
	s := openStore(t, newDatabase(t), nil)
	ctx := t.Context()
	before := time.Now().Add(-time.Minute)
	r := mustReserve(t, s, reserveParams("k"), store.Created)
	if r.CreatedAt.Before(before) || r.CreatedAt.After(time.Now().Add(time.Minute)) || r.CreatedAt.Location() != time.UTC {
		t.Fatalf("created_at %v is not the server's now", r.CreatedAt)
	}
	if d := r.LockedUntil.Sub(r.CreatedAt); d != 30*time.Second {
		t.Fatalf("lease %v", d)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse("x")}); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, reserveParams("k"), store.Existing)
	if swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10}); err != nil || len(swept) != 0 {
		t.Fatalf("sweep: %v %v", swept, err)
	}
}

// TestRoundTrips counts the commands the driver sends for the request path.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	cfg := newDatabase(t)
	var c counter
	cfg.Net = countingNet(&c)
	clock := storetest.NewClock()
	s := openStore(t, cfg, clock.Now)
	ctx := t.Context()

	count := func(name string, fn func()) int64 {
		t.Helper()
		before := c.writes.Load()
		fn()
		n := c.writes.Load() - before
		t.Logf("%s: %d round trip(s)", name, n)
		return n
	}
	// Warm both pools so that no dial or handshake is counted.
	if err := s.DB().PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	warm := mustReserve(t, s, reserveParams("warm"), store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(warm), Response: okResponse("w")}); err != nil {
		t.Fatal(err)
	}

	var r store.Record
	want := map[string]int64{"reserve (new)": 1, "complete": 1, "reserve (replay)": 1}
	got := map[string]int64{
		"reserve (new)": count("reserve (new)", func() { r = mustReserve(t, s, reserveParams("k"), store.Created) }),
		"complete": count("complete", func() {
			if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse("x")}); err != nil {
				t.Fatal(err)
			}
		}),
		"reserve (replay)": count("reserve (replay)", func() { mustReserve(t, s, reserveParams("k"), store.Existing) }),
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d round trips, want %d", k, got[k], n)
		}
	}

	// The transactional forms on DB(): BEGIN, ReserveTx (upsert, select),
	// CompleteTx, COMMIT.
	count("BEGIN + ReserveTx + CompleteTx + COMMIT", func() {
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.ReserveTx(ctx, tx, reserveParams("tx"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CompleteTx(ctx, tx, store.CompleteParams{FenceParams: fence(res.Record), Response: okResponse("x")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	})

	// The fallback of New on a pool without multi-statement support.
	plainCfg := cfg.Clone()
	plainCfg.MultiStatements = false
	plainCfg.InterpolateParams = true
	db, err := sql.Open("mysql", plainCfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ps, err := New(ctx, db, Config{Clock: clock.Now, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	if ps.batch {
		t.Fatal("probe accepted a pool without multiStatements")
	}
	mustReserve(t, ps, reserveParams("warm2"), store.Created)
	if n := count("reserve (new, New without multiStatements)", func() { mustReserve(t, ps, reserveParams("k2"), store.Created) }); n != 4 {
		t.Errorf("fallback reserve: %d round trips, want 4", n)
	}
}

// TestReserveStorm races 64 goroutines over many keys: exactly one winner
// per key, no error surfaced, whatever deadlocks the server reports.
func TestReserveStorm(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock()
	s := openStoreConns(t, newDatabase(t), clock.Now, 32)
	ctx := t.Context()
	const workers, keys = 64, 64
	deadlocksBefore := deadlocks(t, s)
	var mu sync.Mutex
	created := map[string]int{}
	reclaimed := map[string]int{}
	run := func(want store.ReserveOutcome, tally map[string]int) {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				order := rand.Perm(keys)
				if w%2 == 0 { // half the workers in the same order: more lock contention
					for i := range order {
						order[i] = i
					}
				}
				for _, i := range order {
					res, err := s.Reserve(ctx, reserveParams(fmt.Sprint("storm-", i)))
					if err != nil {
						errs <- err
						return
					}
					if res.Outcome == want {
						mu.Lock()
						tally[res.Record.Key]++
						mu.Unlock()
					} else if res.Outcome != store.Existing {
						errs <- fmt.Errorf("unexpected outcome %v", res.Outcome)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	run(store.Created, created)
	for i := range keys {
		k := fmt.Sprint("storm-", i)
		if created[k] != 1 {
			t.Fatalf("%s created %d times", k, created[k])
		}
		if err := s.Release(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: reserveParams(k).Scope, Key: k, Fence: clock.Now().UnixMicro()}}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Second)
	run(store.Reclaimed, reclaimed)
	for i := range keys {
		k := fmt.Sprint("storm-", i)
		if reclaimed[k] != 1 {
			t.Fatalf("%s reclaimed %d times", k, reclaimed[k])
		}
	}
	// Server-wide, so other tests add to it: a rough figure for the log.
	t.Logf("%d reserves, %d retried deadlocks or races; InnoDB deadlocks meanwhile (server-wide): %d",
		2*workers*keys, s.retries.Load(), deadlocks(t, s)-deadlocksBefore)
}

// TestReserveAfterRolledBackInsert queues Reserves behind an uncommitted
// insert of the same key and then rolls it back: the queued upserts then
// race to insert, the pattern where InnoDB reports deadlocks on
// INSERT ... ON DUPLICATE KEY UPDATE. Exactly one must create the record
// and none may fail.
func TestReserveAfterRolledBackInsert(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	for round := range 5 {
		p := reserveParams(fmt.Sprint("rolled-back-", round))
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := s.ReserveTx(ctx, tx, p); err != nil || res.Outcome != store.Created {
			t.Fatalf("reserve tx: %v %v", res.Outcome, err)
		}
		const waiters = 8
		outcomes := make(chan store.ReserveOutcome, waiters)
		errs := make(chan error, waiters)
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				res, err := s.Reserve(ctx, p)
				if err != nil {
					errs <- err
					return
				}
				outcomes <- res.Outcome
			})
		}
		waitForLockWaits(t, s, waiters)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		close(outcomes)
		for err := range errs {
			t.Fatal(err)
		}
		created := 0
		for o := range outcomes {
			if o == store.Created {
				created++
			}
		}
		if created != 1 {
			t.Fatalf("round %d: %d created", round, created)
		}
	}
	t.Logf("deadlocks and duplicate-key races retried: %d", s.retries.Load())
}

// waitForLockWaits gives the racing sessions time to queue behind the
// uncommitted insert: it polls until n of them wait for the row lock at
// once, or for at most two seconds (sessions that lost a deadlock back off
// before they queue again, so all n are rarely seen at one instant).
// Queuing is the point of the race but not its assertion (exactly one
// winner holds whatever the timing), so a run where no session was seen
// waiting is logged, not failed.
func waitForLockWaits(t *testing.T, s *Store, n int) {
	t.Helper()
	start := time.Now()
	for {
		var waiting int
		err := s.DB().QueryRowContext(t.Context(), `
			SELECT COUNT(*) FROM information_schema.INNODB_TRX t
			JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
			WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Since(start) > 2*time.Second {
			if waiting == 0 {
				t.Logf("no session was seen waiting for the row lock (of %d)", n)
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func deadlocks(t *testing.T, s *Store) int64 {
	var name string
	var n int64
	if err := s.DB().QueryRowContext(t.Context(), "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").Scan(&name, &n); err != nil {
		t.Logf("no Innodb_deadlocks status: %v", err)
	}
	return n
}

// TestReserveTxReadsLatestRow: ReserveTx reads the latest row even when
// the caller's REPEATABLE READ snapshot is older than it.
func TestReserveTxReadsLatestRow(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var cnt int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_records").Scan(&cnt); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	mustReserve(t, s, reserveParams("pay-3"), store.Created)
	res, err := s.ReserveTx(ctx, tx, reserveParams("pay-3"))
	if err != nil || res.Outcome != store.Existing || res.Record.State != store.StateInProgress {
		t.Fatalf("reserve tx on newer row: %v %+v %v", res.Outcome, res.Record, err)
	}
}

// TestConcurrentMigrate opens several stores on one empty database at once.
func TestConcurrentMigrate(t *testing.T) {
	t.Parallel()
	cfg := newDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			s, err := Open(context.Background(), cfg.FormatDSN(), Config{})
			if err != nil {
				errs <- err
				return
			}
			errs <- s.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s := openStore(t, cfg, nil)
	var n, versions int
	if err := s.DB().QueryRowContext(t.Context(), "SELECT COUNT(*), COUNT(DISTINCT version) FROM idem_migrations").Scan(&n, &versions); err != nil {
		t.Fatal(err)
	}
	files, err := os.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	if n != versions || n != len(files) {
		t.Fatalf("idem_migrations has %d rows for %d versions, want one per migration file (%d)", n, versions, len(files))
	}
}

// TestSimultaneousAssignment runs Reserve's transitions under MariaDB's
// sql_mode SIMULTANEOUS_ASSIGNMENT, where SET clauses read old values.
func TestSimultaneousAssignment(t *testing.T) {
	t.Parallel()
	cfg := newDatabase(t)
	openStore(t, cfg, nil) // migrate
	cfg.MultiStatements = true
	cfg.InterpolateParams = true
	cfg.Params = map[string]string{"sql_mode": "'STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT'"}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.PingContext(t.Context()); err != nil {
		t.Skipf("server has no SIMULTANEOUS_ASSIGNMENT (MySQL): %v", err)
	}
	clock := storetest.NewClock()
	s, err := New(t.Context(), db, Config{Clock: clock.Now, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	p := reserveParams("k")
	p.LeasePolicy = store.LeaseResume
	r := mustReserve(t, s, p, store.Created)
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence(r)}); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, p, store.Reclaimed)
	clock.Advance(time.Hour)
	p.Owner = 3
	r = mustReserve(t, s, p, store.TakenOver)
	if r.Fence != clock.Now().UnixMicro() || r.Attempts != 3 || r.State != store.StateInProgress || r.Owner != 3 {
		t.Fatalf("record %+v", r)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse("x")}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(48 * time.Hour)
	p.Owner = 4
	r = mustReserve(t, s, p, store.Created)
	if r.Fence != clock.Now().UnixMicro() || r.Attempts != 1 || r.Response != nil || r.Owner != 4 {
		t.Fatalf("record %+v", r)
	}
}

func TestConformanceTx(t *testing.T) {
	storetest.RunTx(t, storetest.TxHarness[*sql.Tx]{
		NewDatabase: func(t *testing.T, clock store.Clock) storetest.TxDatabase[*sql.Tx] {
			s := openStore(t, newDatabase(t), clock)
			if _, err := s.DB().ExecContext(t.Context(), "CREATE TABLE payments (id VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB"); err != nil {
				t.Fatal(err)
			}
			return storetest.TxDatabase[*sql.Tx]{
				Store: s,
				Write: func(ctx context.Context, tx *sql.Tx, id string) error {
					_, err := tx.ExecContext(ctx, "INSERT INTO payments (id) VALUES (?)", id)
					return err
				},
				Count: func(ctx context.Context, id string) (n int, err error) {
					err = s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM payments WHERE id = ?", id).Scan(&n)
					return n, err
				},
			}
		},
	})
}

// TestMigrationsRunAgain: DDL commits on its own, so a crash between a
// migration's statements and its idem_migrations row leaves it to run
// again at the next Open; every migration must take that (an index or a
// column already there is the step done).
func TestMigrationsRunAgain(t *testing.T) {
	t.Parallel()
	cfg := newDatabase(t)
	s := openStore(t, cfg, nil)
	if _, err := s.DB().ExecContext(t.Context(), "DELETE FROM idem_migrations"); err != nil {
		t.Fatal(err)
	}
	again, err := Open(context.Background(), cfg.FormatDSN(), Config{})
	if err != nil {
		t.Fatalf("open after every migration's row was lost: %v", err)
	}
	defer again.Close()
	mustReserve(t, again, reserveParams("after"), store.Created)
}

// TestOwnerOfRowsBeforeMigration: a row older than migration 011 (owner
// NULL) reads as Owner 0, and the next execution stores its Reserve's.
// (That a pending record and its claim have none is the conformance
// suite's PendingHasNoOwner.)
func TestOwnerOfRowsBeforeMigration(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	old := mustReserve(t, s, reserveParams("old"), store.Created)
	if _, err := s.DB().ExecContext(ctx, "UPDATE idem_records SET owner = NULL"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, old.Scope, old.Key); err != nil || got.Owner != 0 {
		t.Fatalf("a row without an owner: Owner %d, %v", got.Owner, err)
	}
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence(old), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	p := reserveParams("old")
	p.Owner = -6
	if r := mustReserve(t, s, p, store.Reclaimed); r.Owner != -6 {
		t.Fatalf("reclaim of a row without an owner: Owner %d, want -6", r.Owner)
	}
}

// TestCapAtAnExpiry: a capped Reserve decides whether it makes one more
// record active and then writes, at one instant of the server's clock. A
// completed record of the key that expires between the two must not count
// as live in the check and be replaced by the write: the tenant would hold
// one active record past its cap.
func TestCapAtAnExpiry(t *testing.T) {
	t.Parallel()
	s := openStore(t, newDatabase(t), nil) // the server's clock
	ctx := t.Context()
	capped := func(k string) store.ReserveParams {
		p := reserveParams(k)
		p.Tenant, p.MaxActive = "t", 1
		return p
	}
	b := mustReserve(t, s, capped("B"), store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(b), Response: okResponse("b"), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, capped("A"), store.Created) // at the cap
	for d := 0; d < 5000; d += 10 {
		if _, err := s.DB().ExecContext(ctx, "UPDATE idem_records SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE `key` = 'B'", d); err != nil {
			t.Fatal(err)
		}
		// Live, B is answered (existing); expired, it would be one more
		// active record at the cap, refused. Never created.
		res, err := s.Reserve(ctx, capped("B"))
		if err == nil && res.Outcome == store.Created {
			var n int
			if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_records WHERE tenant = 't' AND state IN ('pending', 'in_progress', 'unknown')").Scan(&n); err != nil {
				t.Fatal(err)
			}
			t.Fatalf("expiry %d µs ahead: B was created again past the cap of 1: the tenant holds %d active records", d, n)
		}
		if err != nil && !errors.Is(err, store.ErrOverCap) {
			t.Fatal(err)
		}
	}
}

// TestSnapshotConflictIsRetryable: with innodb_snapshot_isolation (the
// default from MariaDB 11.6), a caller's REPEATABLE READ transaction whose
// snapshot is older than the record's last change (here a renewal of the
// lease) fails with error 1020 at CompleteTx: the caller's to retry, like
// PostgreSQL's serialization failures.
func TestSnapshotConflictIsRetryable(t *testing.T) {
	t.Parallel()
	cfg := newDatabase(t)
	cfg.Params = map[string]string{"innodb_snapshot_isolation": "ON"}
	s := openStore(t, cfg, nil)
	ctx := t.Context()
	var on string
	if err := s.DB().QueryRowContext(ctx, "SELECT @@innodb_snapshot_isolation").Scan(&on); err != nil {
		t.Skipf("this server has no innodb_snapshot_isolation: %v", err)
	}
	r := mustReserve(t, s, reserveParams("snap"), store.Created)
	tx := snapshotTx(t, s)
	defer tx.Rollback()
	if err := s.Extend(ctx, store.ExtendParams{FenceParams: fence(r), Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	err := s.CompleteTx(ctx, tx, store.CompleteParams{FenceParams: fence(r), Response: okResponse("x"), TTL: time.Hour})
	if err == nil {
		t.Skip("the server let the transaction write past its snapshot (snapshot isolation off)")
	}
	if !store.IsRetryable(err) {
		t.Fatalf("CompleteTx past the snapshot: %v, not retryable", err)
	}
}

// TestCappedReserveTxPastItsSnapshot: a capped ReserveTx counts the
// tenant's records and reads its key as they are when it holds the
// tenant's lock, even in a caller's REPEATABLE READ transaction whose
// snapshot is older: records another process made active since count
// against the cap, and a key it completed since is a replay, never refused.
// A server that refuses a locking read past the snapshot
// (innodb_snapshot_isolation) answers with a retryable error instead: the
// caller runs its transaction again.
func TestCappedReserveTxPastItsSnapshot(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	capped := func(k string) store.ReserveParams {
		p := reserveParams(k)
		p.Tenant, p.MaxActive = "t", 1
		return p
	}
	reserveTx := func(p store.ReserveParams, since func()) (store.ReserveResult, error) {
		tx := snapshotTx(t, s)
		defer tx.Rollback()
		since()
		return s.ReserveTx(ctx, tx, p)
	}

	res, err := reserveTx(capped("B"), func() { mustReserve(t, s, capped("A"), store.Created) })
	if !errors.Is(err, store.ErrOverCap) && !store.IsRetryable(err) {
		t.Fatalf("ReserveTx of B with A made active since the snapshot, at the cap of 1: %v %v, want ErrOverCap", res.Outcome, err)
	}

	res, err = reserveTx(capped("C"), func() {
		// C created and completed since the snapshot, the tenant at its cap.
		uncapped := capped("C")
		uncapped.MaxActive = 0
		c := mustReserve(t, s, uncapped, store.Created)
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(c), Response: okResponse("c")}); err != nil {
			t.Fatal(err)
		}
	})
	if store.IsRetryable(err) {
		return
	}
	if err != nil || res.Outcome != store.Existing || res.Record.State != store.StateCompleted {
		t.Fatalf("ReserveTx of C completed since the snapshot: %v %s %v, want its replay", res.Outcome, res.Record.State, err)
	}
}

// TestBodyWithinTheServersPacketLimit: a response body the server's
// max_allowed_packet admits is stored, however its bytes escape in a
// statement's text (a zero byte takes two), and one it refuses fails with
// a definite error, not a connection reset that looks transient and would
// be sent again and again.
func TestBodyWithinTheServersPacketLimit(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	var limit int
	if err := s.DB().QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&limit); err != nil {
		t.Fatal(err)
	}
	if limit > 32<<20 {
		t.Skipf("max_allowed_packet is %d: bodies near it are too large for this test", limit)
	}
	fits := make([]byte, limit*5/8) // 1.25 times the limit, escaped
	r := mustReserve(t, s, reserveParams("fits"), store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: store.Response{Status: 200, Body: fits}}); err != nil {
		t.Fatalf("Complete with a body of %d bytes, the server's limit %d: %v", len(fits), limit, err)
	}
	if got, err := s.Get(ctx, r.Scope, r.Key); err != nil || got.Response == nil || !bytes.Equal(got.Response.Body, fits) {
		t.Fatalf("the stored body: %v", err)
	}

	over := make([]byte, limit+1)
	r = mustReserve(t, s, reserveParams("over"), store.Created)
	err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: store.Response{Status: 200, Body: over}})
	if err == nil || store.IsRetryable(err) {
		t.Fatalf("Complete with a body over the server's limit: %v (retryable %v), want a definite error", err, store.IsRetryable(err))
	}
	if got, err := s.Get(ctx, r.Scope, r.Key); err != nil || got.State != store.StateInProgress {
		t.Fatalf("the record of the refused body: %s %v", got.State, err)
	}
}

// snapshotTx begins a REPEATABLE READ transaction (the server's default)
// and reads from idem_records, which takes its snapshot there: what other
// connections commit afterwards is what a test checks the transaction's
// statements still see. The caller rolls it back.
func snapshotTx(t *testing.T, s *Store) *sql.Tx {
	t.Helper()
	tx, err := s.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM idem_records").Scan(&n); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	return tx
}
