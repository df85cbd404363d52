package phase_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/phase"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
	"github.com/jackc/pgx/v5"
)

// Every SQL store can run atomic phases.
var (
	_ phase.Store[pgx.Tx]  = (*postgres.Store)(nil)
	_ phase.Store[*sql.Tx] = (*sqlite.Store)(nil)
	_ phase.Store[*sql.Tx] = (*mysql.Store)(nil)
)

// resumable opens a SQLite store on clock and an engine that resumes
// after the last committed phase.
func resumable(t *testing.T, clock store.Clock) (*sqlite.Store, *idem.Engine) {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), sqlite.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e, err := idem.New(s, idem.Config{LeasePolicy: store.LeaseResume, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s, e
}

// execution holds a request's execution (run through the engine, its
// operation waiting) until the end of the test, then abandons it.
func execution(t *testing.T, e *idem.Engine) *idem.Execution {
	t.Helper()
	got, release, finished := make(chan *idem.Execution, 1), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		call := idem.Call{Method: "POST", Route: "/x", Target: "/x", Keys: []string{"k"}}
		e.Run(context.Background(), call, func(ctx context.Context) idem.Result {
			x := idem.FromContext(ctx)
			got <- x
			<-release
			x.Abandon()
			return idem.Result{}
		})
	}()
	select {
	case x := <-got:
		t.Cleanup(func() { close(release); <-finished })
		return x
	case <-finished:
		t.Fatal("the engine did not run the request")
		return nil
	}
}

// TestPhasesOnSQLite runs atomic phases on the embedded store: a phase that
// fails rolls back its writes and keeps the recovery point; the retry after
// the lease expired resumes at the failed phase; Foreign runs outside the
// transaction.
func TestPhasesOnSQLite(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock()
	s, e := resumable(t, clock.Now)
	if _, err := s.DB().Exec(`CREATE TABLE steps (name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	failSecond := true
	var foreignCalls, inTxDuringForeign int
	step := func(name string) phase.Phase[*sql.Tx] {
		return phase.Phase[*sql.Tx]{Name: name, Run: func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO steps VALUES (?)`, name); err != nil {
				return err
			}
			if name == "second" && failSecond {
				return errors.New("provider said no")
			}
			return nil
		}}
	}
	third := phase.Phase[*sql.Tx]{Name: "third",
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
		if err := phase.Run(r.Context(), x, s, step("first"), step("second"), third); err != nil {
			x.Abandon() // leave the record in progress, as a crash would
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, x.RecoveryPoint())
	}))
	if w := enginetest.SendCharge(h, "trip-1"); w.Code != 500 {
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
	w := enginetest.SendCharge(h, "trip-1")
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
	s, e := resumable(t, nil)
	x := execution(t, e)
	if err := x.Checkpoint(context.Background(), "renamed_phase"); err != nil {
		t.Fatal(err)
	}
	err := phase.Run(context.Background(), x, s, phase.Phase[*sql.Tx]{Name: "a"})
	if err == nil || !strings.Contains(err.Error(), `"renamed_phase"`) {
		t.Fatalf("Run with a recovery point that is none of its phases: %v", err)
	}
}

// Phases whose names cannot be recovery points are refused before any
// phase runs.
func TestPhasesBadNames(t *testing.T) {
	t.Parallel()
	s, e := resumable(t, nil)
	x := execution(t, e)
	ran := 0
	run := func(ctx context.Context, tx *sql.Tx) error { ran++; return nil }
	for name, phases := range map[string][]phase.Phase[*sql.Tx]{
		"no name":  {{Name: "a", Run: run}, {Run: run}},
		"repeated": {{Name: "a", Run: run}, {Name: "b", Run: run}, {Name: "a", Run: run}},
	} {
		err := phase.Run(context.Background(), x, s, phases...)
		if err == nil || !strings.Contains(err.Error(), "phase") {
			t.Errorf("%s: Run returned %v, want an error", name, err)
		}
	}
	if ran != 0 || x.RecoveryPoint() != "" {
		t.Fatalf("phases ran (%d) or checkpointed (%q) despite bad names", ran, x.RecoveryPoint())
	}
}
