package phase_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/phase"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

// A request without a key that the engine lets through (the Stripe
// profile here; KeyRequired false likewise) has no execution: its phases
// run in their transactions, from the first, with no recovery point to
// keep (phase.Run used to dereference the nil execution).
func TestRunWithoutAnExecution(t *testing.T) {
	db := &ledger{Store: memory.New(memory.Config{}), rows: map[string]string{}}
	engine, err := idem.New(db, idem.Config{LeasePolicy: store.LeaseResume, Profile: idem.ProfileStripe})
	if err != nil {
		t.Fatal(err)
	}
	h := engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if x := idem.FromContext(r.Context()); x != nil {
			t.Errorf("an execution without a key: %v", x.Key())
		}
		err := phase.Run(r.Context(), idem.FromContext(r.Context()), db,
			phase.Phase[*ledgerTx]{Name: "one", Run: func(ctx context.Context, tx *ledgerTx) error { tx.rows["one"] = "done"; return nil }},
			phase.Phase[*ledgerTx]{Name: "two", Run: func(ctx context.Context, tx *ledgerTx) error { tx.rows["two"] = "done"; return nil }})
		if err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/rides", strings.NewReader(`{}`)))
	if w.Code != http.StatusCreated || db.rows["one"] != "done" || db.rows["two"] != "done" {
		t.Fatalf("%d, rows %v", w.Code, db.rows)
	}
}

// pausing is a ledger whose transactions call after once they committed.
type pausing struct {
	*ledger
	after func()
}

func (p pausing) InTx(ctx context.Context, fn func(tx *ledgerTx) error) error {
	err := p.ledger.InTx(ctx, fn)
	if err == nil {
		p.after()
	}
	return err
}

// An execution that learnt its lease was lost (a retry took the key over
// and ran the rest of the phases) does not begin another phase: its
// foreign side effect would be made a second time, by a holder whose
// recovery point can no longer commit.
func TestRunStopsOnceTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	storeClock := storetest.NewClock()
	var (
		committed, resume = make(chan struct{}), make(chan struct{})
		commits           atomic.Int32
	)
	db := pausing{
		ledger: &ledger{Store: memory.New(memory.Config{Clock: storeClock.Now}), rows: map[string]string{}},
		after: func() {
			if commits.Add(1) == 1 { // the first execution, after its first phase
				close(committed)
				<-resume
			}
		},
	}
	engine, err := idem.New(db, idem.Config{Lease: 150 * time.Millisecond, LeasePolicy: store.LeaseResume,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var foreign atomic.Int32
	first := make(chan *idem.Execution, 1)
	runErr := make(chan error, 2)
	h := engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := idem.FromContext(r.Context())
		if x.RecoveryPoint() == "" {
			first <- x
		}
		err := phase.Run(r.Context(), x, db,
			phase.Phase[*ledgerTx]{Name: "one", Run: func(ctx context.Context, tx *ledgerTx) error { return nil }},
			phase.Phase[*ledgerTx]{Name: "two",
				Foreign: func(ctx context.Context) error { foreign.Add(1); return nil },
				Run:     func(ctx context.Context, tx *ledgerTx) error { return nil }})
		runErr <- err
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/rides", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "ride-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	done := make(chan struct{})
	go func() { defer close(done); send() }()
	x := <-first
	<-committed
	// The holder stalls after its first phase; its lease lapses on the
	// store's clock and a retry takes the key over and runs phase two.
	for i := 0; ; i++ {
		storeClock.Advance(time.Minute)
		w := send()
		if w.Code == http.StatusCreated {
			break
		}
		if i == 20 {
			t.Fatalf("the retry got %d %s", w.Code, w.Body)
		}
	}
	if err := <-runErr; err != nil {
		t.Fatalf("the retry's phases: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); !x.LeaseLost(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stalled holder never learnt that its lease was lost")
		}
	}
	close(resume)
	<-done
	if err := <-runErr; !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("the stalled holder's Run: %v, want ErrLeaseLost", err)
	}
	if n := foreign.Load(); n != 1 {
		t.Errorf("phase two's foreign side effect was made %d times, want 1", n)
	}
}
