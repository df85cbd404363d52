package sqlite

import (
	"context"

	"github.com/idem-go/idem/internal/groupcommit"
)

// Group commit. Every write transaction of the store commits with an fsync
// (synchronous=FULL), through the one writer connection, so under load
// Reserve and Complete calls queue for that connection anyway. A
// groupcommit.Group of one slot turns that queue into batches: a call that
// finds the writer idle runs alone, exactly as it would without the group;
// the calls that queued while the writer was busy run together in one
// immediate transaction, each inside its own savepoint, and share one
// commit and one fsync. No timer holds a call back. A call whose
// statements fail rolls back to its savepoint, so the others of its batch
// are not affected; a batch whose commit fails has committed nothing, and
// each of its calls then runs alone, unless the batch waited out another
// process's write lock (busy): then each call fails with that error.

// maxGroupOps bounds one batch; what is left waits for the next.
const maxGroupOps = 128

// writeOp is one call through the group.
type writeOp struct {
	fn  func(ctx context.Context, q querier) error
	tx  bool // fn runs several statements: alone, it needs a transaction
	err error
}

func (s *Store) newGroup() {
	s.group = groupcommit.New(1, maxGroupOps, s.writeAlone, s.writeBatch)
}

// write runs fn on the writer, alone or in a batch.
func (s *Store) write(ctx context.Context, tx bool, fn func(ctx context.Context, q querier) error) error {
	op := &writeOp{fn: fn, tx: tx}
	if err := s.group.Do(ctx, op); err != nil {
		return err
	}
	return op.err
}

func (s *Store) writeAlone(ctx context.Context, op *writeOp) {
	if !op.tx {
		op.err = op.fn(ctx, s.writer())
		return
	}
	op.err = s.inTx(ctx, func(q querier) error { return op.fn(ctx, q) })
}

func (s *Store) writeBatch(ctx context.Context, ops []*writeOp) {
	err := s.inTx(ctx, func(q querier) error {
		for _, op := range ops {
			if _, err := q.ExecContext(ctx, "SAVEPOINT idem_op"); err != nil {
				return err
			}
			if op.err = op.fn(ctx, q); op.err != nil {
				if _, err := q.ExecContext(ctx, "ROLLBACK TO idem_op"); err != nil {
					return err
				}
			}
			if _, err := q.ExecContext(ctx, "RELEASE idem_op"); err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case err == nil:
	case busy(err) || ctx.Err() != nil:
		// Another process held the write lock past the busy timeout, or
		// the callers' time is up: alone, each call would only wait for
		// the same again, one after the other.
		for _, op := range ops {
			op.err = err
		}
	default:
		for _, op := range ops {
			s.writeAlone(ctx, op)
		}
	}
}
