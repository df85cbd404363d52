package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// replacedChecks are the four CHECK constraints migration 010 replaced,
// as migrations 001 and 006 left them, by name: the reference the tests
// hold the function to, and what TestRecordCheckUpgrade puts back.
var replacedChecks = []struct{ name, expr string }{
	{"idem_records_state_check", `state IN ('in_progress', 'completed', 'failed_retryable', 'unknown', 'expired', 'pending')`},
	{"idem_records_lease_policy_check", `lease_policy IN ('unknown', 'retry', 'resume')`},
	{"idem_records_fence_check", `fence > 0`},
	{"idem_records_completed_check", `state <> 'completed' OR (response_status IS NOT NULL AND completed_at IS NOT NULL)`},
}

// TestRecordCheckKeepsTheRules evaluates the record's CHECK function
// (migration 010) against the four constraints it replaced, written out
// here as migrations 001 and 006 had them, for every combination of
// valid and invalid states, lease policies, fences and completion
// columns: the two must accept exactly the same rows. A CHECK passes on
// true or NULL, so both sides are compared as such.
func TestRecordCheckKeepsTheRules(t *testing.T) {
	t.Parallel()
	_, schema := openSchema(t, postgres.Config{MaxBatches: -1})
	conn := adminConn(t)
	var old []string
	for _, c := range replacedChecks {
		old = append(old, "coalesce("+c.expr+", true)")
	}
	var rows, accepted, differ int
	err := conn.QueryRow(context.Background(), `
		WITH c AS (
			SELECT state, lease_policy, fence, response_status, completed_at
			FROM unnest(ARRAY['in_progress', 'completed', 'failed_retryable', 'unknown', 'expired', 'pending',
			                  'bogus', '', 'Completed']) state,
			     unnest(ARRAY['unknown', 'retry', 'resume', 'never', '']) lease_policy,
			     unnest(ARRAY[-1, 0, 1, 9223372036854775807]::bigint[]) fence,
			     unnest(ARRAY[NULL, 201]::integer[]) response_status,
			     unnest(ARRAY[NULL, now()]::timestamptz[]) completed_at
		), v AS (
			SELECT coalesce(`+pgx.Identifier{schema, "idem_record_valid"}.Sanitize()+`(state, lease_policy, fence,
				response_status, completed_at), true) AS new,
				`+strings.Join(old, " AND ")+` AS old
			FROM c
		)
		SELECT count(*), count(*) FILTER (WHERE new), count(*) FILTER (WHERE new IS DISTINCT FROM old) FROM v`).
		Scan(&rows, &accepted, &differ)
	if err != nil {
		t.Fatal(err)
	}
	if differ != 0 {
		t.Errorf("the CHECK function and the constraints it replaced disagree on %d of %d rows", differ, rows)
	}
	// Not vacuous: both verdicts occur.
	if accepted == 0 || accepted == rows {
		t.Errorf("%d of %d combinations accepted: the comparison does not tell valid from invalid rows", accepted, rows)
	}
}

// TestRecordCheckRejects writes rows that break each rule into a store's
// table, plain and partitioned: every one is refused as a check violation,
// so the constraint is in force on new rows (it was added NOT VALID) and
// on the partitions too.
func TestRecordCheckRejects(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  postgres.Config
	}{
		{"plain", postgres.Config{MaxBatches: -1}},
		{"partitioned", postgres.Config{MaxBatches: -1, Partitions: 24 * time.Hour}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, schema := openSchema(t, c.cfg)
			conn := adminConn(t)
			insert := `INSERT INTO ` + pgx.Identifier{schema, "idem_records"}.Sanitize() + ` (scope, key, fingerprint, state, fence,
				lease_policy, locked_until, attempts, created_at, updated_at, expires_at, reap_after, response_status, completed_at)
				VALUES ('s', $1, 'fp', $2, $3, $4, now(), 1, now(), now(), now() + interval '1 hour', now() + interval '1 hour', $5, $6)`
			for _, r := range []struct {
				what          string
				state, policy string
				fence         int64
				status        any
				completed     bool
				ok            bool
			}{
				{"a valid in-progress row", "in_progress", "unknown", 1, nil, false, true},
				{"a valid completed row", "completed", "retry", 1, 201, true, true},
				{"an unknown state", "done", "unknown", 1, nil, false, false},
				{"an unknown lease policy", "in_progress", "sometimes", 1, nil, false, false},
				{"a fence of zero", "in_progress", "unknown", 0, nil, false, false},
				{"a completed row without its status", "completed", "unknown", 1, nil, true, false},
				{"a completed row without its instant", "completed", "unknown", 1, 201, false, false},
			} {
				var completedAt any
				if r.completed {
					completedAt = "2026-01-01T00:00:00Z"
				}
				_, err := conn.Exec(context.Background(), insert, r.what, r.state, r.fence, r.policy, r.status, completedAt)
				var pgErr *pgconn.PgError
				switch {
				case r.ok && err != nil:
					t.Errorf("%s: refused: %v", r.what, err)
				case !r.ok && !(errors.As(err, &pgErr) && pgErr.Code == "23514"):
					t.Errorf("%s: %v, want a check violation (23514)", r.what, err)
				}
			}
		})
	}
}

// TestRecordCheckUpgrade applies migration 010 to a table that holds
// records written under the four constraints it replaces, as an upgrade
// does: the store is put back as migration 009 left it (the four
// constraints, no function, 010 not recorded), with in-progress and
// completed records in it, and migrated again. The records stay, the
// constraints are swapped, the store keeps working, and VALIDATE
// CONSTRAINT, which checks every existing row, passes.
func TestRecordCheckUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, schema := openSchema(t, postgres.Config{MaxBatches: -1})
	for i := range 6 {
		p := reserveParams(fmt.Sprintf("before-%d", i))
		res, err := s.Reserve(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(res), Response: okResponse(), TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
	}
	conn := adminConn(t)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	back := `ALTER TABLE ` + table + ` DROP CONSTRAINT idem_records_valid`
	for _, c := range replacedChecks {
		back += `, ADD CONSTRAINT ` + c.name + ` CHECK (` + c.expr + `)`
	}
	back += `;
		DROP FUNCTION ` + pgx.Identifier{schema, "idem_record_valid"}.Sanitize() + `;
		DELETE FROM ` + pgx.Identifier{schema, "idem_migrations"}.Sanitize() + ` WHERE version = 10`
	if _, err := conn.Exec(ctx, back); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migration 010 over existing records: %v", err)
	}
	var checks []string
	rows, err := conn.Query(ctx, `SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c' ORDER BY conname`, table)
	if err != nil {
		t.Fatal(err)
	}
	if checks, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(checks, []string{"idem_records_valid"}) {
		t.Errorf("CHECK constraints after the upgrade: %v", checks)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 6 {
		t.Fatalf("%d records after the upgrade (%v), want 6", n, err)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE `+table+` VALIDATE CONSTRAINT idem_records_valid`); err != nil {
		t.Errorf("the records written before the upgrade fail the new constraint: %v", err)
	}
	res, err := s.Reserve(ctx, reserveParams("after"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(res), Response: okResponse(), TTL: time.Hour}); err != nil {
		t.Fatalf("a completion after the upgrade: %v", err)
	}
	r, err := s.Get(ctx, reserveParams("before-0").Scope, "before-0")
	if err != nil || r.State != store.StateCompleted || r.Response == nil || r.Response.Status != 201 {
		t.Errorf("a record completed before the upgrade reads %+v, %v", r, err)
	}
}
