package postgres

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem/store"
)

// Group commit.
//
// Reserve and the lease-holder updates (Complete, Release, MarkUnknown,
// Checkpoint, Extend) on the store's own pool go through a batcher. A call
// that finds one of Config.MaxBatches slots free runs its statement at once,
// alone, exactly as it would without the batcher, so a lone request pays
// nothing. A call that finds every slot busy queues; when a slot's round
// trip returns, everything queued by then leaves together as one pipeline
// (pgx.Batch) of the very same statements: one round trip, one implicit
// transaction, one commit and one WAL flush for all of them. No timer ever
// holds a call back: a batch is only what piled up while the database was
// busy with the previous one, as in a database's own group commit.
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
// database at once when Config.MaxBatches is 0.
const DefaultMaxBatches = 2

// maxBatchOps bounds one pipeline; what is left waits for the next slot.
const maxBatchOps = 128

// batchOp is one call waiting for, or riding in, a batch.
type batchOp struct {
	ctx      context.Context
	sql      string
	args     []any // $1 scope, $2 key for every batched statement
	returns  bool  // the statement returns a record (Reserve), else a command tag
	done     chan struct{}
	taken    bool // in a batch already; guarded by batcher.mu
	rec      store.Record
	action   string
	tag      pgconn.CommandTag
	err      error
	runAlone bool // the batch rolled back: run the statement by itself
}

type batcher struct {
	s       *Store
	mu      sync.Mutex
	free    int // slots not in flight
	pending []*batchOp
	flights sync.WaitGroup

	batched    atomic.Int64 // calls sent in pipelines of two or more
	rolledBack atomic.Int64 // pipelines rolled back by a statement error
}

func newBatcher(s *Store, slots int) *batcher {
	return &batcher{s: s, free: slots}
}

// errRunAlone tells the caller that its batch rolled back without a verdict
// on its statement.
var errRunAlone = errors.New("idem/postgres: batch rolled back")

// do runs op alone when a slot is free, else queues it for the next batch.
// After do returns, op's results are final unless do returned an error of
// its own (the caller's context ended while op was in a batch).
func (b *batcher) do(op *batchOp) error {
	b.mu.Lock()
	if b.free > 0 {
		b.free--
		b.mu.Unlock()
		b.s.runOne(op.ctx, b.s.pool, op)
		b.release()
		return nil
	}
	op.done = make(chan struct{})
	b.pending = append(b.pending, op)
	b.mu.Unlock()
	select {
	case <-op.done:
		return nil
	case <-op.ctx.Done():
	}
	b.mu.Lock()
	if !op.taken {
		if i := slices.Index(b.pending, op); i >= 0 {
			b.pending = slices.Delete(b.pending, i, i+1)
		}
		b.mu.Unlock()
		return op.ctx.Err()
	}
	b.mu.Unlock()
	// The batch is on its way: its outcome for op is not known yet, as with
	// a single statement abandoned mid-flight.
	return op.ctx.Err()
}

// release hands the caller's slot to what queued meanwhile, or frees it.
func (b *batcher) release() {
	if batch := b.next(); batch != nil {
		b.flights.Add(1)
		go b.loop(batch)
	}
}

// next takes the queued calls for the slot being released, or frees the
// slot when nothing waits.
func (b *batcher) next() []*batchOp {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending) == 0 {
		b.free++
		return nil
	}
	n := min(len(b.pending), maxBatchOps)
	batch := slices.Clone(b.pending[:n])
	b.pending = slices.Delete(b.pending, 0, n)
	for _, op := range batch {
		op.taken = true
	}
	return batch
}

func (b *batcher) loop(batch []*batchOp) {
	defer b.flights.Done()
	for batch != nil {
		b.flush(batch)
		batch = b.next()
	}
}

// flush sends batch as one pipeline and hands every call its result.
func (b *batcher) flush(batch []*batchOp) {
	defer func() {
		for _, op := range batch {
			close(op.done)
		}
	}()
	if len(batch) == 1 {
		b.s.runOne(batch[0].ctx, b.s.pool, batch[0])
		return
	}
	slices.SortStableFunc(batch, func(x, y *batchOp) int {
		return cmp.Or(cmp.Compare(x.args[0].(string), y.args[0].(string)),
			cmp.Compare(x.args[1].(string), y.args[1].(string)))
	})
	b.batched.Add(int64(len(batch)))
	ctx, cancel := batchContext(batch)
	defer cancel()

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

// batchContext outlives no caller that still waits: it ends at the latest
// deadline of the batch's calls (none if one has none), and a caller that
// gives up does not cancel the others' statements.
func batchContext(batch []*batchOp) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, op := range batch {
		d, ok := op.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(batch[0].ctx))
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
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
// update through the batcher when q is the store's pool, directly otherwise
// (the Tx forms, or batching turned off).
func (s *Store) run(ctx context.Context, q querier, returns bool, sql string, args []any) *batchOp {
	op := &batchOp{ctx: ctx, sql: sql, args: args, returns: returns}
	if s.batch == nil || q != querier(s.pool) {
		s.runOne(ctx, q, op)
		return op
	}
	if err := s.batch.do(op); err != nil {
		return &batchOp{err: err}
	}
	if op.runAlone {
		op.runAlone = false
		s.runOne(ctx, q, op)
	}
	return op
}
