package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
)

// Write-first: the handler's business row and the key's completion commit
// in one transaction, so a crash leaves both or neither.
func ExampleStore_CompleteTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "writefirst")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.DB().Exec(`CREATE TABLE charges (key TEXT PRIMARY KEY, amount INTEGER)`)
	engine, err := idem.New(db, idem.Config{})
	if err != nil {
		log.Fatal(err)
	}

	handler := engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		x := idem.FromContext(ctx)
		body := []byte(`{"id":"ch_1"}`)
		tx, err := db.DB().BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		tx.ExecContext(ctx, "INSERT INTO charges (key, amount) VALUES (?, ?)", x.Key(), 100)
		resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		if err := db.CompleteTx(ctx, tx, x.CompleteParams(resp)); err != nil { // the key completes with the business write
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		x.Committed()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		w.Write(body)
	}))

	for i := 0; i < 2; i++ {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "charge-1")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Printf("%d %s replayed=%q\n", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	var rows int
	db.DB().QueryRow(`SELECT count(*) FROM charges`).Scan(&rows)
	fmt.Println("rows:", rows)
	// Output:
	// 201 {"id":"ch_1"} replayed=""
	// 201 {"id":"ch_1"} replayed="true"
	// rows: 1
}
