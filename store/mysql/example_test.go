package mysql_test

import (
	"context"
	"log"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/mysql"
)

func ExampleOpen() {
	ctx := context.Background()
	s, err := mysql.Open(ctx, "idem:secret@tcp(127.0.0.1:3306)/app", mysql.Config{MaxConns: 32})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	res, err := s.Reserve(ctx, store.ReserveParams{
		Scope: "tenant-42|POST /payments", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324",
		Fingerprint: "sha256:…", Lease: 30 * time.Second, TTL: 24 * time.Hour,
		LeasePolicy: store.LeaseUnknown,
	})
	if err != nil {
		log.Fatal(err) // fail closed: the handler does not run
	}
	log.Println(res.Outcome, res.Record.State)
}

// A handler that writes its business rows and completes the key in one
// transaction: either both commit or neither does.
func ExampleStore_CompleteTx() {
	ctx := context.Background()
	s, err := mysql.Open(ctx, "idem:secret@tcp(127.0.0.1:3306)/app", mysql.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	var held store.Record // from a Reserve that returned Created

	err = func() error {
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO payments (id, amount) VALUES (?, ?)", "pay_1", 1000); err != nil {
			return err
		}
		if err := s.CompleteTx(ctx, tx, store.CompleteParams{
			FenceParams: store.FenceParams{Scope: held.Scope, Key: held.Key, Fence: held.Fence},
			Response:    store.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)},
		}); err != nil {
			return err // store.ErrLeaseLost: another worker took the key over
		}
		return tx.Commit()
	}()
	if err != nil {
		log.Fatal(err)
	}
}
