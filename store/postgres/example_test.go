package postgres_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// A handler that writes its business row and completes the key in one
// transaction: either both are committed or neither is.
func Example_transaction() {
	ctx := context.Background()
	s, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), postgres.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	res, err := s.Reserve(ctx, store.ReserveParams{
		Scope: "tenant-1 POST /payments", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324",
		Fingerprint: "sha256:...", Lease: 30 * time.Second, TTL: 24 * time.Hour,
		LeasePolicy: store.LeaseUnknown,
	})
	if err != nil || !res.Outcome.Acquired() {
		return // replay, 409 or 422: the engine decides from res.Record
	}
	err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO payments (id, amount) VALUES ($1, $2)", "pay_1", 100); err != nil {
			return err
		}
		return s.CompleteTx(ctx, tx, store.CompleteParams{
			FenceParams: store.FenceParams{Scope: res.Record.Scope, Key: res.Record.Key, Fence: res.Record.Fence},
			Response:    store.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)},
		})
	})
	if err != nil {
		log.Print(err) // the key stays in_progress; its lease expires into unknown
	}
}
