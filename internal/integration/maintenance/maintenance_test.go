package maintenance_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

func TestSweeper(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			m := enginetest.NewMaint(t, ns, maintenance.Config{BatchSize: 2, BatchPause: time.Second}, idem.Config{})
			for _, k := range []string{"a", "b", "c"} {
				m.Send(k, true)
			}
			if n, err := m.M.SweepOnce(context.Background()); err != nil || n != 0 {
				t.Fatalf("sweep inside the lease: %d %v", n, err)
			}
			// Past the 30s lease, but within the sweeper's grace: a holder
			// whose renewal failed in an outage still gets its record back.
			m.Clock.Advance(31 * time.Second)
			if n, err := m.M.SweepOnce(context.Background()); err != nil || n != 0 {
				t.Fatalf("sweep within the grace: %d %v", n, err)
			}
			m.Clock.Advance(maintenance.DefaultSweepGrace)
			n, err := m.M.SweepOnce(context.Background())
			if err != nil || n != 3 {
				t.Fatalf("sweep after the lease: %d %v, want 3 (in batches of 2)", n, err)
			}
			// Two batches: one pause between them, none after the last.
			if s := m.Clock.Sleeps(); len(s) != 1 || s[0] < 500*time.Millisecond || s[0] >= time.Second {
				t.Fatalf("pauses of a pass of two batches: %v, want one in [500ms, 1s)", s)
			}
			for _, k := range []string{"a", "b", "c"} {
				if s := m.State(k); s != store.StateUnknown {
					t.Fatalf("%s after the sweep: %s", k, s)
				}
			}
			// A retry is told the outcome is unknown; the handler is not run.
			if w := m.Send("a", false); w.Code != 409 {
				t.Fatalf("retry of a swept key: %d", w.Code)
			}
			if m.Calls.Load() != 3 {
				t.Fatalf("handler ran %d times", m.Calls.Load())
			}
		})
	}
}

func TestTwoSweepersResetEachRecordOnce(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			m := enginetest.NewMaint(t, ns, maintenance.Config{BatchSize: 3}, idem.Config{})
			for i := 0; i < 20; i++ {
				m.Send("k"+string(rune('a'+i)), true)
			}
			m.Clock.Advance(time.Minute)
			other := m.Maintainer(maintenance.Config{BatchSize: 3})
			var total atomic.Int64
			errc := make(chan error, 2)
			for _, s := range []*maintenance.Maintainer{m.M, other} {
				go func() {
					n, err := s.SweepOnce(context.Background())
					total.Add(int64(n))
					errc <- err
				}()
			}
			for i := 0; i < 2; i++ {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
			if total.Load() != 20 {
				t.Fatalf("two sweepers reset %d records, want 20", total.Load())
			}
		})
	}
}

func TestReaper(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			m := enginetest.NewMaint(t, ns, maintenance.Config{BatchSize: 2}, idem.Config{TTL: time.Hour})
			for _, k := range []string{"done1", "done2", "done3"} {
				m.Send(k, false)
			}
			m.Send("stuck", true)
			m.Clock.Advance(30 * time.Minute)
			m.Send("young", false)
			if res, err := m.M.ReapOnce(context.Background()); err != nil || res.Deleted != 0 {
				t.Fatalf("reap before expiry: %+v %v", res, err)
			}
			m.Clock.Advance(31 * time.Minute)
			res, err := m.M.ReapOnce(context.Background())
			if err != nil || res.Deleted != 3 || res.Abandoned != 1 {
				t.Fatalf("reap: %+v %v, want 3 deleted, 1 abandoned", res, err)
			}
			if s := m.State("done1"); s != "" {
				t.Fatalf("reaped record still there: %s", s)
			}
			if s := m.State("young"); s != store.StateCompleted {
				t.Fatalf("young record: %s", s)
			}
			// The abandoned request answers with a definite timeout.
			w := m.Send("stuck", true)
			if w.Code != http.StatusGatewayTimeout || !strings.Contains(w.Body.String(), "abandoned") {
				t.Fatalf("retry of an abandoned request: %d %s", w.Code, w.Body)
			}
			// A reaped key is a new request again.
			if w := m.Send("done1", false); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("reaped key: %d %v", w.Code, w.Header())
			}
		})
	}
}

func TestReaperSoftExpire(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			m := enginetest.NewMaint(t, ns, maintenance.Config{SoftExpire: true}, idem.Config{TTL: time.Hour})
			m.Send("k", false)
			m.Clock.Advance(2 * time.Hour)
			if res, err := m.M.ReapOnce(context.Background()); err != nil || res.Deleted != 1 {
				t.Fatalf("soft reap: %+v %v", res, err)
			}
			if s := m.State("k"); s != store.StateExpired {
				t.Fatalf("soft-expired record: %s", s)
			}
		})
	}
}

func TestReconciler(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			// The "provider" knows that "paid" went through and "lost" did
			// not; it cannot tell about "pending" and fails for "broken".
			resolver := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
				switch r.Key {
				case "paid":
					return maintenance.Resolution{Outcome: maintenance.Happened, Response: &store.Response{
						Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_paid"}`)}}, nil
				case "lost":
					return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
				case "partial":
					return maintenance.Resolution{Outcome: maintenance.RunAgain}, nil
				case "broken":
					return maintenance.Resolution{}, errors.New("provider returned 500")
				}
				return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
			})
			m := enginetest.NewMaint(t, ns, maintenance.Config{Resolver: resolver, ReconcileBackoff: time.Minute,
				ReconcileMaxBackoff: 4 * time.Minute, MaxReconcileAttempts: 3}, idem.Config{})
			m.Unknown("paid", "lost", "partial", "pending", "broken")
			res, err := m.M.ReconcileOnce(context.Background())
			if err != nil || res.Resolved != 3 || res.Deferred != 2 {
				t.Fatalf("reconcile: %+v %v", res, err)
			}
			// Resolved: the retry replays the provider's answer, or runs again.
			if w := m.Send("paid", false); w.Code != 201 || w.Body.String() != `{"id":"ch_paid"}` {
				t.Fatalf("retry of a resolved key: %d %s", w.Code, w.Body)
			}
			for _, k := range []string{"lost", "partial"} {
				if w := m.Send(k, false); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("retry of %s after it was released: %d", k, w.Code)
				}
			}
			// Not due again until the backoff passed.
			if res, _ := m.M.ReconcileOnce(context.Background()); res.Deferred != 0 {
				t.Fatalf("reconciled before the backoff: %+v", res)
			}
			m.Clock.Advance(time.Minute)
			if res, _ := m.M.ReconcileOnce(context.Background()); res.Deferred != 2 {
				t.Fatalf("second attempt: %+v", res)
			}
			m.Clock.Advance(2 * time.Minute)
			res, _ = m.M.ReconcileOnce(context.Background())
			if res.DeadLettered != 2 {
				t.Fatalf("third attempt should dead-letter both: %+v", res)
			}
			m.Clock.Advance(24 * time.Hour)
			if res, _ := m.M.ReconcileOnce(context.Background()); res != (maintenance.ReconcileResult{}) {
				t.Fatalf("dead letters were retried: %+v", res)
			}
			for key, dead := range map[string]bool{"pending": true, "broken": true, "paid": false} {
				rec, err := m.Record(key)
				if err != nil || rec.DeadLettered() != dead {
					t.Fatalf("%s: DeadLettered = %v, want %v (%v)", key, rec.DeadLettered(), dead, err)
				}
			}
			// A webhook settles "broken": never replay a cookie or a
			// hop-by-hop header, whatever the caller passes.
			if err := m.M.Settle(context.Background(), enginetest.Scope, "broken", fenceOf(t, m, "broken"), maintenance.Resolution{Outcome: maintenance.Happened, Response: &store.Response{
				Status: 201, Header: http.Header{"Set-Cookie": {"s=1"}, "Connection": {"close"}, "X-Id": {"7"}}, Body: []byte("{}")}}); err != nil {
				t.Fatal(err)
			}
			if w := m.Send("broken", false); w.Code != 201 || w.Header().Get("Set-Cookie") != "" || w.Header().Get("Connection") != "" || w.Header().Get("X-Id") != "7" {
				t.Fatalf("replay of a settled record: %d %v", w.Code, w.Header())
			}
			// An operator settles a dead letter.
			if err := m.M.Settle(context.Background(), enginetest.Scope, "pending", fenceOf(t, m, "pending"), maintenance.Resolution{Outcome: maintenance.DidNotHappen}); err != nil {
				t.Fatal(err)
			}
			if w := m.Send("pending", false); w.Code != 201 {
				t.Fatalf("retry after the operator released it: %d", w.Code)
			}
			if err := m.M.Settle(context.Background(), enginetest.Scope, "pending", fenceOf(t, m, "pending"), maintenance.Resolution{Outcome: maintenance.DidNotHappen}); !errors.Is(err, store.ErrStateConflict) {
				t.Fatalf("settling a completed record: %v", err)
			}
		})
	}
}

// A record the reconciler cannot settle (a verdict the store refuses, a
// resolver's error no text column takes) is one failed attempt on that
// record, deferred and in the end dead-lettered like any other: it never
// stops the pass, which goes on to the records after it.
func TestReconcilerGoesPastARecordItCannotSettle(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			raw := "provider said: \x00\xff" + strings.Repeat("é", 2000)
			resolver := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
				switch r.Key {
				case "refused":
					return maintenance.Resolution{Outcome: maintenance.Happened, Response: &store.Response{}}, nil // no status
				case "garbled":
					return maintenance.Resolution{}, errors.New(raw)
				}
				return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
			})
			m := enginetest.NewMaint(t, ns, maintenance.Config{Resolver: resolver, ReconcileBackoff: time.Minute,
				MaxReconcileAttempts: 2}, idem.Config{})
			m.Unknown("refused", "garbled", "good")
			res, err := m.M.ReconcileOnce(context.Background())
			if err != nil || res.Resolved != 1 || res.Deferred != 2 {
				t.Fatalf("reconcile: %+v %v", res, err)
			}
			rec, err := m.Record("garbled")
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.ValidString(rec.LastError) || strings.ContainsRune(rec.LastError, 0) || len(rec.LastError) > store.MaxErrorBytes ||
				!strings.HasPrefix(rec.LastError, "provider said: ") {
				t.Fatalf("stored error: %d bytes %q...", len(rec.LastError), rec.LastError[:min(40, len(rec.LastError))])
			}
			m.Clock.Advance(time.Minute)
			if res, err := m.M.ReconcileOnce(context.Background()); err != nil || res.DeadLettered != 2 {
				t.Fatalf("second attempt: %+v %v, want both dead-lettered", res, err)
			}
		})
	}
}

// Maintainers that list one due record at once (every instance of a
// service runs one) and both fail to settle it count one attempt: the
// record is deferred or dead-lettered once, and dead-lettered after
// MaxReconcileAttempts attempts, not after half of them.
func TestReconcilersCountOneAttempt(t *testing.T) {
	for _, ns := range realStores(t) {
		for _, maxAttempts := range []int{10, 1} { // deferred; dead-lettered
			t.Run(fmt.Sprintf("%s/MaxReconcileAttempts=%d", ns.Name, maxAttempts), func(t *testing.T) {
				t.Parallel()
				// The provider answers once both maintainers asked it: both
				// listed the record before either deferred it.
				var asked atomic.Int32
				both := make(chan struct{})
				resolver := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
					if asked.Add(1) == 2 {
						close(both)
					}
					select {
					case <-both:
						return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
					case <-ctx.Done():
						return maintenance.Resolution{}, ctx.Err()
					}
				})
				logs := &enginetest.Logs{}
				cfg := maintenance.Config{Resolver: resolver, MaxReconcileAttempts: maxAttempts, Logger: slog.New(logs)}
				m := enginetest.NewMaint(t, ns, cfg, idem.Config{})
				other := m.Maintainer(cfg)
				m.Unknown("k")
				results := make(chan maintenance.ReconcileResult, 2)
				errc := make(chan error, 2)
				for _, mt := range []*maintenance.Maintainer{m.M, other} {
					go func() {
						res, err := mt.ReconcileOnce(context.Background())
						results <- res
						errc <- err
					}()
				}
				var total maintenance.ReconcileResult
				for range 2 {
					if err := <-errc; err != nil {
						t.Fatal(err)
					}
					res := <-results
					total.Resolved += res.Resolved
					total.Deferred += res.Deferred
					total.DeadLettered += res.DeadLettered
				}
				dead := maxAttempts == 1
				want := maintenance.ReconcileResult{Deferred: 1}
				if dead {
					want = maintenance.ReconcileResult{DeadLettered: 1}
				}
				if asked.Load() != 2 || total != want {
					t.Fatalf("two passes asked %d times and counted %+v, want 2 and %+v", asked.Load(), total, want)
				}
				rec, err := m.Record("k")
				if err != nil || rec.ReconcileAttempts != 1 || rec.DeadLettered() != dead {
					t.Fatalf("after both passes: %d attempts, dead-lettered %v (%v); want 1, %v", rec.ReconcileAttempts, rec.DeadLettered(), err, dead)
				}
				if logged := len(logs.At(slog.LevelError)); logged != total.DeadLettered {
					t.Fatalf("%d dead letters logged, want %d", logged, total.DeadLettered)
				}
			})
		}
	}
}

// A reconciler whose attempt another reconciler recorded first counts it
// as raced, not as its own failure: the provider failed for both, or for
// this one after the other settled the record, and the other's deferral,
// dead letter or settlement stands. Only the attempt the store took counts
// as failed.
func TestReconcilerRacedAttemptIsNotAFailure(t *testing.T) {
	for _, ns := range realStores(t) {
		for _, tc := range []struct {
			name        string
			maxAttempts int
			other       maintenance.Outcome // the other reconciler's verdict; StillUnknown: its resolver fails
			want        maintenance.ReconcileResult
			otherEvents map[string]int64
		}{
			{"Deferred", 10, maintenance.StillUnknown, maintenance.ReconcileResult{Deferred: 1},
				map[string]int64{"reconcile_failed": 1}},
			{"DeadLettered", 1, maintenance.StillUnknown, maintenance.ReconcileResult{DeadLettered: 1},
				map[string]int64{"reconcile_failed": 1, "reconcile_dead": 1}},
			{"Settled", 10, maintenance.DidNotHappen, maintenance.ReconcileResult{Resolved: 1},
				map[string]int64{"reconcile_resolved": 1}},
		} {
			t.Run(ns.Name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				// The provider fails for the first reconciler once the
				// other one, which listed the record too, recorded its
				// attempt.
				asked, recorded := make(chan struct{}), make(chan struct{})
				slow := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
					close(asked)
					select {
					case <-recorded:
						return maintenance.Resolution{}, errors.New("provider returned 500")
					case <-ctx.Done():
						return maintenance.Resolution{}, ctx.Err()
					}
				})
				fast := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
					if tc.other == maintenance.StillUnknown {
						return maintenance.Resolution{}, errors.New("provider returned 500")
					}
					return maintenance.Resolution{Outcome: tc.other}, nil
				})
				first, second := &obstest.Recorder{}, &obstest.Recorder{}
				m := enginetest.NewMaint(t, ns, maintenance.Config{Resolver: slow, MaxReconcileAttempts: tc.maxAttempts, Observer: first}, idem.Config{})
				other := m.Maintainer(maintenance.Config{Resolver: fast, MaxReconcileAttempts: tc.maxAttempts, Observer: second})
				m.Unknown("k")
				type result struct {
					res maintenance.ReconcileResult
					err error
				}
				done := make(chan result, 1)
				go func() {
					res, err := m.M.ReconcileOnce(context.Background())
					done <- result{res, err}
				}()
				<-asked
				if res, err := other.ReconcileOnce(context.Background()); err != nil || res != tc.want {
					t.Fatalf("the other reconciler: %+v %v, want %+v", res, err, tc.want)
				}
				close(recorded)
				if got := <-done; got.err != nil || got.res != (maintenance.ReconcileResult{}) {
					t.Fatalf("the raced reconciler: %+v %v, want nothing counted", got.res, got.err)
				}
				events := func(r *obstest.Recorder) map[string]int64 {
					got := r.Events()
					delete(got, "reconcile_scheduled") // the sweep's
					delete(got, "zombies_swept")
					return got
				}
				if got, want := events(first), map[string]int64{"reconcile_raced": 1}; !maps.Equal(got, want) {
					t.Errorf("the raced reconciler's events: %v, want %v", got, want)
				}
				if got := events(second); !maps.Equal(got, tc.otherEvents) {
					t.Errorf("the other reconciler's events: %v, want %v", got, tc.otherEvents)
				}
			})
		}
	}
}

// An attempt about an execution that is no longer the record's counts for
// nothing: while the provider was asked, a webhook settled the record, a
// retry ran it again under a new fence and its outcome is unknown too. The
// older execution's attempt neither defers nor dead-letters the new one,
// which the next pass asks about afresh.
func TestReconcilerAttemptAboutAnOlderExecution(t *testing.T) {
	for _, ns := range realStores(t) {
		for _, maxAttempts := range []int{10, 1} { // deferred; dead-lettered
			t.Run(fmt.Sprintf("%s/MaxReconcileAttempts=%d", ns.Name, maxAttempts), func(t *testing.T) {
				t.Parallel()
				var (
					m     *enginetest.Maint
					first int64 // the fence of the execution first listed
				)
				resolver := maintenance.ResolverFunc(func(ctx context.Context, r store.Record) (maintenance.Resolution, error) {
					if r.Fence == first {
						if err := m.M.Settle(ctx, enginetest.Scope, r.Key, r.Fence, maintenance.Resolution{Outcome: maintenance.DidNotHappen}); err != nil {
							return maintenance.Resolution{}, err
						}
						m.Unknown(r.Key)
					}
					return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
				})
				logs := &enginetest.Logs{}
				m = enginetest.NewMaint(t, ns, maintenance.Config{Resolver: resolver, MaxReconcileAttempts: maxAttempts,
					Logger: slog.New(logs)}, idem.Config{})
				m.Unknown("k")
				first = fenceOf(t, m, "k")
				res, err := m.M.ReconcileOnce(context.Background())
				if err != nil || res != (maintenance.ReconcileResult{}) {
					t.Fatalf("pass about the older execution: %+v %v, want nothing counted", res, err)
				}
				rec, err := m.Record("k")
				if err != nil || rec.Fence == first || rec.State != store.StateUnknown || rec.ReconcileAttempts != 0 ||
					rec.DeadLettered() || rec.ReconcileAfter.After(m.Clock.Now()) {
					t.Fatalf("the new execution after that pass: %+v %v; want unknown, due, with no attempt", rec, err)
				}
				if logged := logs.At(slog.LevelError); len(logged) != 0 {
					t.Fatalf("logged %q about the older execution", logged)
				}
				want := maintenance.ReconcileResult{Deferred: 1}
				if maxAttempts == 1 {
					want = maintenance.ReconcileResult{DeadLettered: 1}
				}
				if res, err := m.M.ReconcileOnce(context.Background()); err != nil || res != want {
					t.Fatalf("pass about the new execution: %+v %v, want %+v", res, err, want)
				}
			})
		}
	}
}

// A settlement that does not say what happened is refused before the
// store is asked, and the record stays unknown.
func TestSettleRefusesIncompleteVerdicts(t *testing.T) {
	t.Parallel()
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	m.Unknown("k")
	for _, res := range []maintenance.Resolution{
		{Outcome: maintenance.StillUnknown},
		{Outcome: maintenance.Outcome(7)},
		{Outcome: maintenance.Happened}, // without the response to replay
	} {
		if err := m.M.Settle(context.Background(), enginetest.Scope, "k", fenceOf(t, m, "k"), res); err == nil || !strings.HasPrefix(err.Error(), "maintenance: ") {
			t.Errorf("Settle(%v) = %v, want a clear error", res.Outcome, err)
		}
	}
	if s := m.State("k"); s != store.StateUnknown {
		t.Fatalf("after refused settlements: %s", s)
	}
	if _, err := m.M.ReconcileOnce(context.Background()); err == nil {
		t.Fatal("ReconcileOnce without a Resolver succeeded")
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[maintenance.Outcome]string{
		maintenance.StillUnknown: "still_unknown", maintenance.Happened: "happened",
		maintenance.DidNotHappen: "did_not_happen", maintenance.RunAgain: "run_again",
		maintenance.Outcome(9): "Outcome(9)", maintenance.Outcome(-1): "Outcome(-1)",
	} {
		if got := o.String(); got != want {
			t.Errorf("%d: %q, want %q", int(o), got, want)
		}
	}
}

// fenceOf is the fence key's record holds now: the execution a settlement
// decided now is about.
func fenceOf(t *testing.T, m *enginetest.Maint, key string) int64 {
	t.Helper()
	rec, err := m.Record(key)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Fence
}
