package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
)

// The background and operator statements (sweep, reap, claim, the
// listings) run with sequential scans off, set by a first statement of
// their pipeline for its implicit transaction only (one round trip).
//
// Their plans are cached with the connection, and may be made while the
// table is still almost empty: the planner then prefers reading the whole
// table to an index, since every column that tells an in-flight record
// from a completed one is left out of the indexes (a completion must
// write no index entry, see migration 008). Each of these statements has
// an index for its range; turning sequential scans off makes the plan use
// it whatever the table's size when it was planned.
//
// The same settings turn JIT compilation off. The planner does not forbid
// a sequential scan it cannot avoid (the one-row idem_sweep_mark has no
// index the sweep could use): up to PostgreSQL 17 it adds 10^10 to its
// cost. A plan that costs that much passes every JIT threshold
// (jit_above_cost, and the inlining and optimisation ones), so the server
// would compile the statement with LLVM at every execution: about half a
// second of CPU for a sweep of a few rows that runs in 2 ms without it,
// seconds on a loaded machine, spent while the sweep holds the sweep mark
// and every other sweeper waits.
const noSeqScanSettings = `set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)`

// sqlNoSeqScan turns sequential scans (and JIT) off for the rest of its
// transaction.
const sqlNoSeqScan = `SELECT ` + noSeqScanSettings

// indexed runs first (sqlNoSeqScan, or a statement that also takes a
// lock) then sql, in one pipeline, and hands read sql's result.
func (s *Store) indexed(ctx context.Context, first, sql string, args []any, read func(pgx.BatchResults) error) error {
	var b pgx.Batch
	b.Queue(first)
	b.Queue(sql, args...)
	return s.acknowledged(ctx, s.pool, func(q querier) error {
		br := q.SendBatch(ctx, &b)
		_, err := br.Exec()
		if err == nil {
			err = read(br)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

// queryIndexed runs first then sql (indexed) and collects sql's records.
func (s *Store) queryIndexed(ctx context.Context, first, sql string, args []any,
	collect func(pgx.Rows) ([]store.Record, error)) ([]store.Record, error) {
	var recs []store.Record
	err := s.indexed(ctx, first, sql, args, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err == nil {
			recs, err = collect(rows)
		}
		return err
	})
	return recs, err
}

// execIndexed runs sql after sqlNoSeqScan (indexed) and returns the rows it
// affected.
func (s *Store) execIndexed(ctx context.Context, sql string, args ...any) (int64, error) {
	var n int64
	err := s.indexed(ctx, sqlNoSeqScan, sql, args, func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		n = tag.RowsAffected()
		return err
	})
	return n, err
}
