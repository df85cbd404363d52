package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
)

// TestPhasesOnSQLite runs atomic phases on the embedded store: a phase that
// fails rolls back its writes and keeps the recovery point; the retry after
// the lease expired resumes at the failed phase; Foreign runs outside the
// transaction.
func TestPhasesOnSQLite(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), sqlite.Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.DB().Exec(`CREATE TABLE steps (name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, idem.Config{LeasePolicy: store.LeaseResume, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	failSecond := true
	var foreignCalls, inTxDuringForeign int
	step := func(name string) idem.Phase[*sql.Tx] {
		return idem.Phase[*sql.Tx]{Name: name, Run: func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO steps VALUES (?)`, name); err != nil {
				return err
			}
			if name == "second" && failSecond {
				return errors.New("provider said no")
			}
			return nil
		}}
	}
	third := idem.Phase[*sql.Tx]{Name: "third",
		Foreign: func(ctx context.Context) error {
			foreignCalls++
			// The writer is free while the foreign call runs: a write from
			// elsewhere does not wait for a transaction of ours.
			if _, err := s.DB().ExecContext(ctx, `INSERT INTO steps VALUES ('outside')`); err != nil {
				inTxDuringForeign++
			}
			return nil
		},
		Run: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO steps VALUES ('third')`)
			return err
		},
	}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := idem.FromContext(r.Context())
		if err := idem.RunPhases(r.Context(), x, s, step("first"), step("second"), third); err != nil {
			x.Abandon() // leave the record in progress, as a crash would
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, x.RecoveryPoint())
	}))
	if w := sendCharge(h, "trip-1"); w.Code != 500 {
		t.Fatalf("first attempt: %d %s", w.Code, w.Body)
	}
	steps := func() []string {
		rows, err := s.DB().Query(`SELECT name FROM steps ORDER BY rowid`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			rows.Scan(&n)
			out = append(out, n)
		}
		return out
	}
	if got := steps(); len(got) != 1 || got[0] != "first" {
		t.Fatalf("after the failed phase: %v, want [first] (second rolled back)", got)
	}
	failSecond = false
	clock.Advance(31 * time.Second)
	w := sendCharge(h, "trip-1")
	if w.Code != 201 || w.Body.String() != "third" {
		t.Fatalf("resumed attempt: %d %s", w.Code, w.Body)
	}
	if got := steps(); len(got) != 4 || got[0] != "first" || got[1] != "second" || got[2] != "outside" || got[3] != "third" {
		t.Fatalf("steps %v, want [first second outside third]", got)
	}
	if foreignCalls != 1 || inTxDuringForeign != 0 {
		t.Fatalf("foreign calls %d, blocked writes %d", foreignCalls, inTxDuringForeign)
	}
}

func TestPhasesUnknownRecoveryPoint(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), sqlite.Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, _ := idem.New(s, idem.Config{LeasePolicy: store.LeaseResume, Logger: slog.New(slog.DiscardHandler)})
	call := idem.Call{Method: "POST", Route: "/x", Target: "/x", Keys: []string{"k"}}
	e.Run(context.Background(), call, func(ctx context.Context) idem.Result {
		x := idem.FromContext(ctx)
		defer x.Abandon()
		if err := x.Checkpoint(ctx, "renamed_phase"); err != nil {
			t.Fatal(err)
		}
		err = idem.RunPhases(ctx, x, s, idem.Phase[*sql.Tx]{Name: "a"})
		if err == nil {
			t.Fatal("RunPhases accepted a recovery point that is none of its phases")
		}
		return idem.Result{}
	})
}
