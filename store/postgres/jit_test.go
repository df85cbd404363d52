package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store/postgres"
)

// TestSeqScanOffStatementsNotCompiled runs every statement the store runs
// with sequential scans off after the very statement that opens its
// pipeline, as the generic plan a connection keeps, under EXPLAIN ANALYZE
// with the server's JIT settings: none may be compiled. With sequential
// scans off, an unavoidable sequential scan (the sweep's read of the
// one-row idem_sweep_mark) costs 10^10 more, past every JIT threshold,
// and the sweep spent half a second of CPU compiling itself at every
// batch while it held the sweep mark.
func TestSeqScanOffStatementsNotCompiled(t *testing.T) {
	ctx := context.Background()
	s, schema := openSchema(t, postgres.Config{MaxBatches: -1})
	conn := adminConn(t)
	var jit bool
	if err := conn.QueryRow(ctx, "SELECT pg_jit_available() AND current_setting('jit')::boolean").Scan(&jit); err != nil {
		t.Fatal(err)
	}
	if !jit {
		t.Skip("the server has no JIT compilation: nothing to check")
	}
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan; SET search_path = "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	statements := s.Statements()
	for name := range seqScanOff {
		sql, ok := statements[name]
		if !ok {
			continue // a statement of partitioned tables only
		}
		// The statement that opens the statement's pipeline.
		first, args := postgres.SQLNoSeqScan, []any(nil)
		switch name {
		case "sweep":
			first = statements["sweepLock"]
		case "reserveMany", "completeMany":
			first, args = postgres.SQLBatchLockTimeout, []any{"100ms"}
		}
		if plan := analyze(t, conn, name, first, args, sql); strings.Contains(plan, "JIT:") {
			t.Errorf("%s is compiled at each execution:\n%s", name, plan)
		}
	}
}

// analyze runs first, then explains sql's execution with every parameter
// NULL, in one transaction that it rolls back, and returns the plan.
func analyze(t *testing.T, conn *pgx.Conn, name, first string, args []any, sql string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, first, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	// A prepared statement outlives the transaction's rollback.
	stmt := "analyze_" + name
	if _, err := tx.Exec(ctx, "PREPARE "+stmt+" AS "+sql); err != nil {
		t.Fatalf("prepare %s: %v", name, err)
	}
	defer conn.Exec(ctx, "DEALLOCATE "+stmt)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE) EXECUTE "+stmt+nullArgs(sql), pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	return strings.Join(lines, "\n")
}
