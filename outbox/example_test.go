package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// A payment endpoint behind idem on PostgreSQL. The handler does not call
// the payment provider: the payment row, the key's completion and the
// charge message commit in one transaction, and the outbox delivers the
// charge afterwards, at least once, with a key the provider deduplicates
// on.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := postgres.New(ctx, pool, postgres.Config{})
	if err != nil {
		log.Fatal(err)
	}

	charge := outbox.DelivererFunc(func(ctx context.Context, msg outbox.Message) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://payments.example/v1/charges", bytes.NewReader(msg.Payload))
		if err != nil {
			return "", err
		}
		req.Header.Set("Idempotency-Key", msg.Key) // the provider deduplicates redeliveries
		req.Header.Set("Idempotency-Fence", strconv.FormatInt(msg.Fence, 10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return "", fmt.Errorf("provider: %s", resp.Status)
		}
		var obj struct{ ID string }
		err = json.NewDecoder(resp.Body).Decode(&obj)
		return obj.ID, err
	})
	ob, err := outbox.NewPostgres(pool, outbox.Config{Deliverers: map[string]outbox.Deliverer{"charge": charge}})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := ob.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer ob.Stop(ctx) //nolint:errcheck // shutting down

	eng, err := idem.New(st, idem.Config{})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /charges", eng.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		x := idem.FromContext(ctx)
		body := []byte(`{"status":"pending"}`)
		resp := store.Response{Status: http.StatusAccepted, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		err := st.InTx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO payments (key, amount) VALUES ($1, $2)`, x.Key(), 100); err != nil {
				return err
			}
			if err := st.CompleteTx(ctx, tx, x.CompleteParams(resp)); err != nil {
				return err
			}
			return ob.EnqueueTx(ctx, tx, outbox.Message{
				Kind:    "charge",
				Key:     outbox.KeyFor(x.Scope(), x.Key(), "charge"),
				Fence:   x.Fence(),
				Payload: json.RawMessage(`{"amount":100,"currency":"eur"}`),
			})
		})
		if err != nil {
			// Nothing committed: idem releases the key and a retry runs again.
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		x.Committed()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		w.Write(body) //nolint:errcheck // the client may be gone
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
