package idem_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"pgregory.net/rapid"

	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

// A Reserve whose answer was lost, though the store applied it: the
// engine reads the record back and releases its own reservation, so that
// the client's retry runs the request, which never ran, instead of
// finding it in progress and, once the lease lapsed, unknown.
func TestLostReservationIsReleased(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	f.store.LoseReserves.Store(1)
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 503, "store-unavailable")
	r, err := f.store.Get(context.Background(), "0:POST /v1/charges", strings.Trim(uuid, `"`))
	if err != nil {
		t.Fatal(err)
	}
	if r.State != store.StateFailedRetryable || r.LastError != "reservation_unacknowledged" {
		t.Fatalf("the reservation whose answer was lost: %s %q, want failed_retryable reservation_unacknowledged", r.State, r.LastError)
	}
	if w := f.do(post(uuid, `{}`)); w.Code != 201 {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// The record read back after a lost answer is another request's (a
// duplicate's Reserve lost the answer that named the first one's record):
// the engine leaves it in progress, and the first request completes it.
func TestLostReservationOfAnotherRequestIsKept(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	started, hold := make(chan *idem.Execution, 1), make(chan struct{})
	h := f.engine.Middleware(holdingHandler(started, hold))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- sendKeyed(h, "k") }()
	x := <-started
	f.store.LoseReserves.Store(1)
	enginetest.WantProblem(t, sendKeyed(h, "k"), 503, "store-unavailable")
	r, err := f.store.Get(context.Background(), "0:POST /v1/slow", "k")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != store.StateInProgress || r.Fence != x.Fence() {
		t.Fatalf("the first request's record: %s fence %d, want in_progress %d", r.State, r.Fence, x.Fence())
	}
	close(hold)
	if w := <-done; w.Code != 201 {
		t.Fatalf("the first request: %d", w.Code)
	}
}

// A client that leaves while its Reserve is under way cancels it: the
// store may have committed the reservation all the same. Nobody waits for
// the answer, and the engine releases it, even after a Reserve that took
// the whole store timeout (lateLoss gives the caller its answer only
// then).
func TestLostReservationOfALeftClientIsReleased(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	s := &lateLoss{Store: f.store, left: cancel}
	e, err := idem.New(s, idem.Config{StoreTimeout: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequestWithContext(ctx, "POST", "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	e.Middleware(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), r)
	rec, err := f.store.Get(context.Background(), "0:POST /v1/charges", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StateFailedRetryable || rec.LastError != "reservation_unacknowledged" {
		t.Fatalf("the reservation of a client that left: %s %q", rec.State, rec.LastError)
	}
}

// lateLoss reserves, waits out the call's store timeout, calls left when
// set (the client leaving then), and answers as a store whose call ended:
// the reservation is made, its answer lost. Once done is set, it is the
// store it wraps.
type lateLoss struct {
	store.Store
	left func()
	done bool // Reserves pass through
}

func (s *lateLoss) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if s.done {
		return s.Store.Reserve(ctx, p)
	}
	if _, err := s.Store.Reserve(ctx, p); err != nil {
		return store.ReserveResult{}, err
	}
	<-ctx.Done()
	if s.left != nil {
		s.left()
	}
	return store.ReserveResult{}, ctx.Err()
}

// A Reserve that took the whole store timeout is not followed by a read
// at once: the store is slow, and asking it again would double the
// client's wait. The reservation is read back once the store timeout has
// passed again, by the retry of its key, which then runs the request.
func TestSlowLostReservationIsReadBackLater(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	s := &lateLoss{Store: f.store}
	e, h, runs := quickEngine(t, s)
	enginetest.WantProblem(t, sendKeyed(h, "k"), 503, "store-unavailable")
	if n := f.store.Gets.Load(); n != 0 {
		t.Fatalf("%d reads after a Reserve that timed out", n)
	}
	if rec, err := f.store.Get(context.Background(), "0:POST /v1/slow", "k"); err != nil || rec.State != store.StateInProgress {
		t.Fatalf("the reservation: %v %v", rec.State, err)
	}
	s.done = true
	// Too early: the Reserve's statement may still be under way.
	if w := sendKeyed(h, "k"); w.Code != http.StatusConflict {
		t.Fatalf("a retry at once: %d, want 409 in progress", w.Code)
	}
	time.Sleep(quickTimeout + 10*time.Millisecond)
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || *runs != 1 {
		t.Fatalf("a retry after the store timeout: %d, %d runs", w.Code, *runs)
	}
	if n := idem.WaitLost(e); n != 0 {
		t.Fatalf("%d reservations still remembered", n)
	}
}

// The store is away when the engine reads back a reservation whose
// answer was lost (a failover): it remembers the reservation, and with it
// the retries that failed while the store was away (any of them may have
// reserved the key). The client's retry, once the store answers, gives
// the reservation back first and runs the request.
func TestLostReservationWhileStoreAwayIsReleasedByTheRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	f.store.LoseReserves.Store(1)
	f.store.FailGets.Store(1)
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 503, "store-unavailable")
	key := strings.Trim(uuid, `"`)
	if r, err := f.store.Get(context.Background(), "0:POST /v1/charges", key); err != nil || r.State != store.StateInProgress {
		t.Fatalf("the reservation while the store is away: %s %v", r.State, err)
	}
	// A retry while the store is away fails too.
	f.store.Down.Store(true)
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 503, "store-unavailable")
	f.store.Down.Store(false)
	if n := idem.WaitLost(f.engine); n != 1 {
		t.Fatalf("%d reservations remembered, want 1", n)
	}
	if w := f.do(post(uuid, `{}`)); w.Code != 201 {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if n := idem.WaitLost(f.engine); n != 0 {
		t.Fatalf("%d reservations still remembered", n)
	}
}

// With several instances on one store, the client's retry may reach
// another one, after the lease lapsed: that instance finds the key
// unknown. The instance that lost the answer reads it back in the
// background of its next request, finds it unknown under its own owner,
// and resolves it to failed_retryable: no handler ran. The retry after
// runs the request.
func TestLostReservationLapsedToUnknownIsResolved(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	clk := newStepClock() // sweeps fall due on it alone
	idem.SetClock(f.engine, clk)
	_, h, runs := quickEngine(t, f.store) // another instance
	f.store.LoseReserves.Store(1)
	f.store.FailGets.Store(1)
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 503, "store-unavailable")
	f.clock.Advance(idem.DefaultLease + time.Second)
	retry := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", uuid)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	enginetest.WantProblem(t, retry(), 409, "outcome-unknown")
	clk.Advance(300 * time.Millisecond) // a sweep is due
	if w := f.do(post(`"another"`, `{}`)); w.Code != 201 {
		t.Fatalf("another request: %d", w.Code)
	}
	if n := idem.WaitLost(f.engine); n != 0 {
		t.Fatalf("%d reservations still remembered", n)
	}
	r, err := f.store.Get(context.Background(), "0:POST /v1/charges", strings.Trim(uuid, `"`))
	if err != nil || r.State != store.StateFailedRetryable {
		t.Fatalf("the reservation that lapsed: %s %v, want failed_retryable", r.State, err)
	}
	if w := retry(); w.Code != 201 || *runs != 1 {
		t.Fatalf("the retry after: %d, %d runs", w.Code, *runs)
	}
}

// A sweep stops at the store's first failure, and tries again later: the
// reservations it could not read stay remembered, and the next sweep,
// once the store answers, gives them back.
func TestLostReservationsSweepWaitsForTheStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	clk := newStepClock() // sweeps fall due on it alone
	idem.SetClock(f.engine, clk)
	f.store.LoseReserves.Store(2)
	f.store.FailGets.Store(2)
	for _, k := range []string{`"a"`, `"b"`} {
		enginetest.WantProblem(t, f.do(post(k, `{}`)), 503, "store-unavailable")
	}
	// The next request, once a sweep is due, starts it; its first read
	// fails.
	clk.Advance(300 * time.Millisecond)
	f.store.FailGets.Store(1)
	if w := f.do(post(`"c"`, `{}`)); w.Code != 201 {
		t.Fatalf("another request: %d", w.Code)
	}
	if n := idem.WaitLost(f.engine); n != 2 || f.store.Gets.Load() != 3 {
		t.Fatalf("after a sweep the store failed: %d reservations remembered, want 2; %d reads, want 3", n, f.store.Gets.Load())
	}
	// Not due yet: the request after starts no sweep.
	if w := f.do(post(`"d"`, `{}`)); w.Code != 201 {
		t.Fatalf("another request: %d", w.Code)
	}
	if idem.WaitLost(f.engine); f.store.Gets.Load() != 3 {
		t.Fatalf("%d reads, want none before the sweep is due", f.store.Gets.Load()-3)
	}
	// Once due, a readiness check starts it.
	clk.Advance(300 * time.Millisecond)
	if err := f.engine.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := idem.WaitLost(f.engine); n != 0 {
		t.Fatalf("%d reservations remembered after the store came back", n)
	}
	for _, k := range []string{"a", "b"} {
		r, err := f.store.Get(context.Background(), "0:POST /v1/charges", k)
		if err != nil || r.State != store.StateFailedRetryable || r.LastError != "reservation_unacknowledged" {
			t.Fatalf("%s: %s %q %v", k, r.State, r.LastError, err)
		}
	}
}

// A statement whose connection was cut can commit after the engine read
// the record back and found none (a server notices a lost client only
// when it answers): the engine looks once more, a store timeout later, and
// the retry after that runs the request.
func TestLostReservationCommittedAfterTheReadIsReleased(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	s := &lateCommit{Store: f.store}
	_, h, runs := quickEngine(t, s)
	enginetest.WantProblem(t, sendKeyed(h, "k"), 503, "store-unavailable")
	if rec, err := f.store.Get(context.Background(), "0:POST /v1/slow", "k"); err != nil || rec.State != store.StateInProgress {
		t.Fatalf("the reservation that committed late: %v %v", rec.State, err)
	}
	time.Sleep(quickTimeout + 10*time.Millisecond)
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || *runs != 1 {
		t.Fatalf("the retry: %d, %d runs", w.Code, *runs)
	}
}

// quickEngine is an engine over s with a store timeout of quickTimeout,
// and its middleware around a handler that counts its runs.
func quickEngine(t *testing.T, s store.Store) (*idem.Engine, http.Handler, *int) {
	t.Helper()
	e, err := idem.New(s, idem.Config{StoreTimeout: quickTimeout, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var runs int
	return e, e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
	})), &runs
}

// quickTimeout is short enough for a test to wait out, long enough that
// a retry sent at once arrives within it on a loaded machine.
const quickTimeout = 200 * time.Millisecond

// lateCommit fails its first Reserve at once, and applies it after the
// next Get has answered.
type lateCommit struct {
	store.Store
	pending *store.ReserveParams
}

func (s *lateCommit) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if s.pending == nil {
		s.pending = &p
		return store.ReserveResult{}, enginetest.ErrOutage
	}
	return s.Store.Reserve(ctx, p)
}

func (s *lateCommit) Get(ctx context.Context, scope, key string) (store.Record, error) {
	r, err := s.Store.Get(ctx, scope, key)
	if p := s.pending; p != nil && p.Scope == scope && p.Key == key {
		if _, err := s.Store.Reserve(ctx, *p); err != nil {
			return r, err
		}
		s.pending = &store.ReserveParams{} // applied
	}
	return r, err
}

// While the breaker is open, the retry of a remembered key does not read
// it back: its Reserve is refused at once, and a read of a store that
// hangs would hold the client for a store timeout first.
func TestLostReservationIsNotReadBackWhileTheBreakerIsOpen(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{BreakerFailures: 1, BreakerOpen: time.Minute, BreakerMaxOpen: time.Minute}, nil)
	f.store.LoseReserves.Store(1)
	f.store.FailGets.Store(1)
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 503, "store-unavailable")
	gets := f.store.Gets.Load()
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 503, "store-unavailable")
	if n := f.store.Gets.Load() - gets; n != 0 {
		t.Fatalf("%d reads while the breaker is open", n)
	}
	if n := idem.WaitLost(f.engine); n != 1 {
		t.Fatalf("%d reservations remembered, want 1", n)
	}
}

// TestLostReservationsProperty runs random sequences of requests, sent to
// two instances, over a store that loses the answers of Reserves it
// applied, fails reads, goes away and comes back, and lets leases lapse. Whatever the sequence, once
// the store answers again and a sweep has run, every key runs when it is
// sent again, and no key's handler ever ran twice: a reservation whose
// answer was lost never ends as unknown while the engine that made it
// lives, and the engine never gives back a record whose handler ran.
func TestLostReservationsProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		storeClock := storetest.NewClock()
		s := &enginetest.Flaky{Store: memory.New(memory.Config{Clock: storeClock.Now})}
		clk := newStepClock()
		runs := map[string]int{}
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs[r.Header.Get("Idempotency-Key")]++
			w.WriteHeader(http.StatusCreated)
		})
		// Two instances of a service on one store, each with its own
		// memory of the reservations it lost.
		var engines []*idem.Engine
		var handlers []http.Handler
		for range 2 {
			e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			idem.SetClock(e, clk)
			engines, handlers = append(engines, e), append(handlers, e.Middleware(handler))
		}
		send := func(instance int, key string) int {
			r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			handlers[instance].ServeHTTP(w, r)
			idem.WaitLost(engines[instance]) // the sweep it started, if any: each step is deterministic
			return w.Code
		}
		keys := []string{"a", "b", "c"}
		t.Repeat(map[string]func(*rapid.T){
			"send": func(t *rapid.T) {
				send(rapid.IntRange(0, 1).Draw(t, "instance"), rapid.SampledFrom(keys).Draw(t, "key"))
			},
			"lose the next Reserve's answer": func(t *rapid.T) { s.LoseReserves.Store(1) },
			"fail the next reads": func(t *rapid.T) {
				s.FailGets.Store(int64(rapid.IntRange(1, 3).Draw(t, "reads")))
			},
			"store away": func(t *rapid.T) { s.Down.Store(true) },
			"store back": func(t *rapid.T) { s.Down.Store(false) },
			"lapse the leases": func(t *rapid.T) {
				storeClock.Advance(idem.DefaultLease + time.Second)
			},
			"time passes": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.IntRange(1, 20000).Draw(t, "ms")) * time.Millisecond)
			},
			"readiness check": func(t *rapid.T) {
				e := engines[rapid.IntRange(0, 1).Draw(t, "instance")]
				_ = e.Ready(context.Background())
				idem.WaitLost(e)
			},
			"": func(t *rapid.T) {
				for k, n := range runs {
					if n > 1 {
						t.Fatalf("key %s ran %d times", k, n)
					}
				}
			},
		})
		// The store answers again; the breaker and the sweeps' wait
		// pass; a readiness check of each instance starts its sweep.
		s.Down.Store(false)
		s.FailGets.Store(0)
		s.LoseReserves.Store(0)
		clk.Advance(idem.DefaultBreakerMaxOpen + time.Second)
		for i, e := range engines {
			_ = e.Ready(context.Background())
			if n := idem.WaitLost(e); n != 0 {
				t.Fatalf("instance %d: %d reservations still remembered with the store back", i, n)
			}
		}
		for i, k := range keys {
			if code := send(i%2, k); code != http.StatusCreated {
				t.Fatalf("key %s sent again: %d, want 201", k, code)
			}
			if runs[k] != 1 {
				t.Fatalf("key %s ran %d times, want 1", k, runs[k])
			}
		}
	})
}
