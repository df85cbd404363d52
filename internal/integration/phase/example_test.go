package phase_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/phase"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
)

// A ride is booked in three phases; the card is charged in the second,
// outside its transaction, with the idempotency key.
func ExampleRun() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "phases")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "rides.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.DB().Exec(`CREATE TABLE rides (key TEXT PRIMARY KEY, charge TEXT, receipt INTEGER NOT NULL DEFAULT 0)`)
	// A retry after a crash continues after the last committed phase.
	engine, err := idem.New(db, idem.Config{LeasePolicy: store.LeaseResume})
	if err != nil {
		log.Fatal(err)
	}

	handler := engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		x := idem.FromContext(ctx)
		var charge string
		createRide := func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO rides (key) VALUES (?)`, x.Key())
			return err
		}
		chargeCard := func(ctx context.Context) error {
			charge = "ch_" + x.Key() // the provider's answer to a call that carries the key
			return nil
		}
		recordCharge := func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE rides SET charge = ? WHERE key = ?`, charge, x.Key())
			return err
		}
		sendReceipt := func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE rides SET receipt = 1 WHERE key = ?`, x.Key())
			return err
		}

		err := phase.Run(ctx, x, db,
			phase.Phase[*sql.Tx]{Name: "ride_created", Run: createRide},
			phase.Phase[*sql.Tx]{Name: "charge_created", Foreign: chargeCard, Run: recordCharge}, // one foreign call per phase, made outside the transaction
			phase.Phase[*sql.Tx]{Name: "receipt_sent", Run: sendReceipt},
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
	var charged string
	db.DB().QueryRow(`SELECT charge FROM rides WHERE key = 'ride-1'`).Scan(&charged)
	fmt.Println(charged)
	// Output:
	// 201 ride ride-1: receipt_sent
	// ch_ride-1
}
