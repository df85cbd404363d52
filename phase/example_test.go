package phase_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/phase"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// ledger is a stand-in for the application's database, so that the
// example runs without one: rows under a lock, a transaction that applies
// its rows and the recovery point together at commit. With a real
// database the SQL stores are the phase.Store (SQLite and MySQL take a
// *sql.Tx, PostgreSQL a pgx.Tx), as in internal/integration/phase.
type ledger struct {
	*memory.Store
	mu   sync.Mutex
	rows map[string]string
}

type ledgerTx struct {
	rows  map[string]string
	point *store.CheckpointParams
}

func (l *ledger) InTx(ctx context.Context, fn func(tx *ledgerTx) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	tx := &ledgerTx{rows: map[string]string{}}
	if err := fn(tx); err != nil {
		return err // nothing of the phase is kept
	}
	if tx.point != nil {
		if err := l.Checkpoint(ctx, *tx.point); err != nil {
			return err
		}
	}
	maps.Copy(l.rows, tx.rows)
	return nil
}

func (l *ledger) CheckpointTx(ctx context.Context, tx *ledgerTx, p store.CheckpointParams) error {
	tx.point = &p
	return nil
}

// A ride is booked in three phases; the card is charged in the second,
// outside its transaction, with the idempotency key.
func ExampleRun() {
	db := &ledger{Store: memory.New(memory.Config{}), rows: map[string]string{}}
	// A retry after a crash continues after the last committed phase.
	engine, err := idem.New(db, idem.Config{LeasePolicy: store.LeaseResume})
	if err != nil {
		panic(err)
	}
	handler := engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		x := idem.FromContext(ctx)
		var charge string
		err := phase.Run(ctx, x, db,
			phase.Phase[*ledgerTx]{Name: "ride_created", Run: func(ctx context.Context, tx *ledgerTx) error {
				tx.rows["ride "+x.Key()] = "booked"
				return nil
			}},
			phase.Phase[*ledgerTx]{Name: "charge_created",
				Foreign: func(ctx context.Context) error {
					charge = "ch_" + x.Key() // the provider's answer to a call that carries the key
					return nil
				},
				Run: func(ctx context.Context, tx *ledgerTx) error {
					tx.rows["charge "+x.Key()] = charge
					return nil
				}},
			phase.Phase[*ledgerTx]{Name: "receipt_sent", Run: func(ctx context.Context, tx *ledgerTx) error {
				tx.rows["receipt "+x.Key()] = "sent"
				return nil
			}},
		)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "ride %s: %s", x.Key(), x.RecoveryPoint())
	}))

	r := httptest.NewRequest("POST", "/v1/rides", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "ride-1")
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Body)
	fmt.Println(db.rows["charge ride-1"])
	// Output:
	// 201 ride ride-1: receipt_sent
	// ch_ride-1
}
