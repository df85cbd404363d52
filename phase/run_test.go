package phase_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/phase"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
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
