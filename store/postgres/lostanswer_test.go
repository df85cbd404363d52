package postgres_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/internal/testkit/pgrelay"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// TestLostReservationAnswer cuts the connection between the engine and
// PostgreSQL after the server committed a reservation and before its
// answer reached the engine: the statement's row went out, and the server
// then committed and said so (ReadyForQuery), but the engine only sees the
// connection drop. The engine reads the record back on a new connection,
// finds it in progress under its own owner, and releases it; the client's
// retry then runs the request, once.
func TestLostReservationAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	relay, s, _, runs, send := lostSetup(t, `"lost"`)

	relay.Arm()
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("the request whose reservation's answer was lost: %d, want 503", code)
	}
	if !relay.Cut() {
		t.Fatal("the relay never cut a connection")
	}
	r, err := s.Get(ctx, "0:POST "+engineRoute, "lost")
	if err != nil {
		t.Fatalf("the reservation was not committed: %v", err)
	}
	if r.State != store.StateFailedRetryable || r.LastError != "reservation_unacknowledged" {
		t.Fatalf("the reservation whose answer was lost: %s %q, want failed_retryable reservation_unacknowledged", r.State, r.LastError)
	}
	if code := send(); code != http.StatusCreated {
		t.Fatalf("the retry: %d, want 201", code)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// TestLostReservationAnswerWhileServerAway cuts the connection as
// TestLostReservationAnswer does, and the server then stays out of reach
// for a while, as in a failover: the engine cannot read the record back,
// and remembers the reservation. Once the server answers again, the
// client's retry reads it back first, releases it, and runs the request,
// once.
func TestLostReservationAnswerWhileServerAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	relay, _, direct, runs, send := lostSetup(t, `"away"`)

	relay.SetDown(true) // from the cut on
	relay.Arm()
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("the request whose reservation's answer was lost: %d, want 503", code)
	}
	if !relay.Cut() {
		t.Fatal("the relay never cut a connection")
	}
	r, err := direct.Get(ctx, "0:POST "+engineRoute, "away")
	if err != nil || r.State != store.StateInProgress {
		t.Fatalf("while the server is away, the reservation: %s %v, want in_progress", r.State, err)
	}
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("a retry while the server is away: %d, want 503", code)
	}
	relay.SetDown(false)
	if code := send(); code != http.StatusCreated {
		t.Fatalf("the retry once the server is back: %d, want 201", code)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if r, err := direct.Get(ctx, "0:POST "+engineRoute, "away"); err != nil || r.State != store.StateCompleted {
		t.Fatalf("the record: %s %v, want completed", r.State, err)
	}
}

// lostSetup opens a store that reaches PostgreSQL through a
// pgrelay.Relay, and one on the same schema that does not (direct), and
// returns send, which posts one request with key through an engine over
// the first, to a handler that counts its runs.
func lostSetup(t *testing.T, key string) (relay *pgrelay.Relay, s, direct *postgres.Store, runs *atomic.Int64, send func() int) {
	t.Helper()
	ctx := context.Background()
	relay = pgrelay.New(t, testURL(t))
	schema := newSchema(t)
	var err error
	if s, err = postgres.Open(ctx, relay.URL, postgres.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if direct, err = postgres.Open(ctx, testURL(t), postgres.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	runs = new(atomic.Int64)
	h := newEngine(t, s).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	send = func() int {
		r := httptest.NewRequest(http.MethodPost, engineURL, strings.NewReader(engineReqBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	return relay, s, direct, runs, send
}
