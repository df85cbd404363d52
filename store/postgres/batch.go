package postgres

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem/internal/groupcommit"
	"github.com/idem-go/idem/store"
)

// Group commit.
//
// Reserve and the lease-holder updates (Complete, Release, MarkUnknown,
// Checkpoint, Extend) on the store's own pool go through a
// groupcommit.Group of Config.MaxBatches slots. A call that finds a slot
// free runs its statement at once, alone, exactly as without the group, so
// a lone request pays nothing. The calls that queue while every slot is
// busy leave together, when a slot's round trip returns, as one pipeline
// (pgx.Batch) of the very same statements: one round trip, one implicit
// transaction, one commit and one WAL flush for all of them. No timer ever
// holds a call back.
//
// The statements of a batch commit or roll back together. A statement error
// (a constraint the parameters break, a deadlock, a serialization failure)
// rolls back the whole batch before anything is reported, so every call of
// that batch then runs alone, and only the faulty one sees its error. A
// connection lost before the commit was confirmed leaves the outcome unknown
// to every call of the batch, as it would for a single statement.
//
// Within a batch, statements run in (scope, key) order, so two batches in
// flight take their row locks in the same order and cannot deadlock each
// other.

// DefaultMaxBatches is the number of batches that may be on their way to the
// database at once when Config.MaxBatches is 0. The statements of one batch
// run one after the other on one server backend, so the slots bound how
// many backends work on batched calls at once: fewer slots make larger
// batches and fewer commits (the least CPU per request), more slots let a
// server with many cores run them in parallel. Measured on two cores
// shared by client and server, 2 spent the least CPU per request and 4 kept
// most of that saving while matching the throughput of no batching when
// other processes competed for the cores.
const DefaultMaxBatches = 4

// maxBatchOps bounds one pipeline; what is left waits for the next slot.
const maxBatchOps = 128

// batchOp is one statement waiting for, or riding in, a batch.
type batchOp struct {
	sql      string
	args     []any // $1 scope, $2 key for every batched statement
	returns  bool  // the statement returns a record (Reserve), else a command tag
	rec      store.Record
	action   string
	tag      pgconn.CommandTag
	err      error
	runAlone bool // the batch rolled back: run the statement by itself
}

type batcher struct {
	s          *Store
	group      *groupcommit.Group[*batchOp]
	rolledBack atomic.Int64 // pipelines rolled back by a statement error
}

func newBatcher(s *Store, slots int) *batcher {
	b := &batcher{s: s}
	b.group = groupcommit.New(slots, maxBatchOps,
		func(ctx context.Context, op *batchOp) { s.runOne(ctx, s.pool, op) }, b.flush)
	return b
}

// flush sends two or more statements as one pipeline.
func (b *batcher) flush(ctx context.Context, batch []*batchOp) {
	slices.SortStableFunc(batch, func(x, y *batchOp) int {
		return cmp.Or(cmp.Compare(x.args[0].(string), y.args[0].(string)),
			cmp.Compare(x.args[1].(string), y.args[1].(string)))
	})
	var pb pgx.Batch
	for _, op := range batch {
		pb.Queue(op.sql, op.args...)
	}
	br := b.s.pool.SendBatch(ctx, &pb)
	rolledBack := false
	for _, op := range batch {
		if op.returns {
			op.err = scanRecord(br.QueryRow(), &op.rec, &op.action)
		} else {
			op.tag, op.err = br.Exec()
		}
		var pgErr *pgconn.PgError
		if errors.As(op.err, &pgErr) {
			rolledBack = true
		}
	}
	err := br.Close()
	var pgErr *pgconn.PgError
	switch {
	case rolledBack || errors.As(err, &pgErr) || (err != nil && pgconn.SafeToRetry(err)):
		// Nothing of the batch committed: every call runs alone.
		b.rolledBack.Add(1)
		for _, op := range batch {
			op.runAlone, op.err = true, nil
		}
	case err != nil:
		for _, op := range batch {
			op.err = err
		}
	}
}

// runOne runs op's statement by itself on q.
func (s *Store) runOne(ctx context.Context, q querier, op *batchOp) {
	if op.returns {
		op.err = scanRecord(q.QueryRow(ctx, op.sql, op.args...), &op.rec, &op.action)
	} else {
		op.tag, op.err = q.Exec(ctx, op.sql, op.args...)
	}
}

// run executes one statement of Reserve (returns) or of a lease-holder
// update through the group when q is the store's pool, directly otherwise
// (the Tx forms, or batching turned off).
func (s *Store) run(ctx context.Context, q querier, returns bool, sql string, args []any) *batchOp {
	op := &batchOp{sql: sql, args: args, returns: returns}
	if s.batch == nil || q != querier(s.pool) {
		s.runOne(ctx, q, op)
		return op
	}
	if err := s.batch.group.Do(ctx, op); err != nil {
		return &batchOp{err: err}
	}
	if op.runAlone {
		op.runAlone = false
		s.runOne(ctx, q, op)
	}
	return op
}
