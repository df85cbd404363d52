package postgres

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

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
// (pgx.Batch): one round trip, one implicit transaction, one commit and one
// WAL flush for all of them. Reserves and Completes ride in one multi-row
// statement each (see flush); the rest are the very same statements as
// alone. No timer ever holds a call back.
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
// batches, fewer commits and the least CPU per request; more slots let a
// server with many cores run them in parallel (the proxy's
// --store-batches). Through the proxy on two cores shared by client and
// server, one slot served 1.2x to 1.35x the new keys and 1.25x the replays
// of four, in two runs (BENCHMARKS.md).
//
// A slot whose statement hangs (it waits for a row lock that a caller's
// open transaction holds through the Tx forms) would hold up every call
// queued behind it. Two things bound that: a batch runs with lock_timeout
// batchLockTimeout, so a batch that waits for a lock rolls back and its
// calls run alone, outside the slots (only the call that needs the lock
// waits for it); and a queue that has not moved for stallAfter gets up to
// maxExtraSlots extra slots, one batch each, for the case where the slot
// is held by a lone call, which runs as it would without the group.
const DefaultMaxBatches = 1

const (
	batchLockTimeout = "100ms"
	stallAfter       = 50 * time.Millisecond
	maxExtraSlots    = 8
)

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
	slots      int
	force      bool // Config.ForceBatches
	group      *groupcommit.Group[*batchOp]
	rolledBack atomic.Int64 // pipelines rolled back by a statement error
	many       atomic.Int64 // multi-row statements sent
}

func newBatcher(s *Store, slots int, force bool) *batcher {
	b := &batcher{s: s, slots: slots, force: force}
	alone := func(ctx context.Context, op *batchOp) { s.runOne(ctx, s.pool, op) }
	if force {
		alone = func(ctx context.Context, op *batchOp) { b.flush(ctx, []*batchOp{op}) }
	}
	b.group = groupcommit.New(slots, maxBatchOps, alone, b.flush)
	b.group.Unstall(stallAfter, maxExtraSlots)
	return b
}

// flush sends two or more statements as one pipeline. The first Reserve
// of each key rides in one multi-row statement (sqlReserveMany), the first
// Complete of each key in another (sqlCompleteMany); a call repeating a key
// already in its statement, and the other transitions, follow as single
// statements in the same pipeline, so each sees the writes queued before
// it, as if the calls had run one after the other.
func (b *batcher) flush(ctx context.Context, batch []*batchOp) {
	slices.SortStableFunc(batch, func(x, y *batchOp) int {
		return cmp.Or(cmp.Compare(x.args[0].(string), y.args[0].(string)),
			cmp.Compare(x.args[1].(string), y.args[1].(string)))
	})
	q := &b.s.q
	var reserves, completes, singles []*batchOp
	var lastReserve, lastComplete *batchOp
	for _, op := range batch {
		switch {
		case op.sql == q.reserve && !sameKey(op, lastReserve):
			reserves, lastReserve = append(reserves, op), op
		case op.sql == q.complete && !sameKey(op, lastComplete):
			completes, lastComplete = append(completes, op), op
		default:
			singles = append(singles, op)
		}
	}
	var pb pgx.Batch
	// Local to the batch's implicit transaction: a lock wait ends the
	// batch instead of holding up its other calls (see DefaultMaxBatches).
	pb.Queue(sqlBatchLockTimeout, batchLockTimeout)
	// On a partitioned table, the locks of every key the batch reserves,
	// before the statements that read them (partition.go); a lock wait
	// past the timeout rolls the batch back like a row lock's.
	locks := b.s.partitioned() && queueKeyLocks(&pb, q, batch)
	// What each queued statement answers for: the calls of a multi-row
	// statement, or one call's single statement.
	type step struct {
		ops  []*batchOp
		many bool
	}
	var steps []step
	for _, group := range [][]*batchOp{reserves, completes} {
		switch {
		case len(group) > 1 || (b.force && len(group) == 1):
			queueMany(&pb, q, group)
			b.many.Add(1)
			steps = append(steps, step{group, true})
		case len(group) == 1:
			singles = append([]*batchOp{group[0]}, singles...)
		}
	}
	for _, op := range singles {
		pb.Queue(op.sql, op.args...)
		steps = append(steps, step{[]*batchOp{op}, false})
	}
	conn, err := b.s.pool.Acquire(ctx)
	if err != nil {
		b.failed(batch, false, err)
		return
	}
	defer conn.Release()
	br := conn.SendBatch(ctx, &pb)
	_, err = br.Exec()
	if err == nil && locks {
		_, err = br.Exec()
	}
	var pgErr *pgconn.PgError
	rolledBack := errors.As(err, &pgErr)
	for _, st := range steps {
		var err error
		ops := st.ops
		switch {
		case st.many:
			err = readMany(br, ops[0].sql == q.reserve, ops)
		case ops[0].returns:
			ops[0].err = scanRecord(br.QueryRow(), &ops[0].rec, &ops[0].action)
			err = ops[0].err
		default:
			ops[0].tag, ops[0].err = br.Exec()
			err = ops[0].err
		}
		if errors.As(err, &pgErr) {
			rolledBack = true
		}
	}
	err = br.Close()
	if standbyWaitCancelled(conn) && err == nil && !rolledBack {
		err = errStandbyWait
	}
	b.failed(batch, rolledBack, err)
}

// failed reports how a batch ended to its calls: rolled back by a
// statement's error (or not sent at all), each runs alone; failed
// otherwise, each gets err.
func (b *batcher) failed(batch []*batchOp, rolledBack bool, err error) {
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

// queueKeyLocks queues the locks of the keys of the batch's Reserves, and
// reports whether there were any.
func queueKeyLocks(pb *pgx.Batch, q *queries, batch []*batchOp) bool {
	var scopes, keys []string
	for _, op := range batch {
		if op.sql == q.reserve {
			scopes, keys = append(scopes, op.args[0].(string)), append(keys, op.args[1].(string))
		}
	}
	if len(keys) == 0 {
		return false
	}
	pb.Queue(q.keyLocks, scopes, keys)
	return true
}

// sameKey reports whether two batched statements name the same record.
func sameKey(x, y *batchOp) bool {
	return y != nil && x.args[0] == y.args[0] && x.args[1] == y.args[1]
}

// queueMany queues the multi-row form of ops' statement (Reserve or
// Complete), whose arguments it gathers column by column.
func queueMany(pb *pgx.Batch, q *queries, ops []*batchOp) {
	n := len(ops)
	scopes, keys := make([]string, n), make([]string, n)
	nows := make([]pgtype.Timestamptz, n)
	for i, op := range ops {
		scopes[i], keys[i] = op.args[0].(string), op.args[1].(string)
	}
	if ops[0].sql == q.reserve {
		// $3 fingerprint, $4 lease, $5 TTL, $6 policy, $7 now, $8 tenant,
		// $9 owner.
		fps, policies, tenants := make([]string, n), make([]string, n), make([]string, n)
		leases, ttls, owners := make([]int64, n), make([]int64, n), make([]int64, n)
		for i, op := range ops {
			fps[i], leases[i], ttls[i], policies[i] = op.args[2].(string), op.args[3].(int64), op.args[4].(int64), op.args[5].(string)
			nows[i], tenants[i], owners[i] = timestamptz(op.args[6]), op.args[7].(string), op.args[8].(int64)
		}
		pb.Queue(q.reserveMany, scopes, keys, fps, leases, ttls, policies, nows, tenants, owners)
		return
	}
	// $3 fence, $4 now, $5 status, $6 headers, $7 body, $8 omitted, $9 TTL.
	fences, ttls := make([]int64, n), make([]int64, n)
	statuses := make([]int32, n)
	headers := make([]pgtype.Text, n)
	bodies := make([][]byte, n)
	omitted := make([]bool, n)
	for i, op := range ops {
		fences[i], nows[i] = op.args[2].(int64), timestamptz(op.args[3])
		statuses[i] = int32(op.args[4].(int))
		headers[i] = op.args[5].(pgtype.Text)
		bodies[i], omitted[i], ttls[i] = op.args[6].([]byte), op.args[7].(bool), op.args[8].(int64)
	}
	pb.Queue(q.completeMany, scopes, keys, fences, nows, statuses, headers, bodies, omitted, ttls)
}

// timestamptz is a statement's clock argument (nil: the database's) as an
// array element.
func timestamptz(now any) pgtype.Timestamptz {
	t, ok := now.(time.Time)
	return pgtype.Timestamptz{Time: t, Valid: ok}
}

// readMany reads the answer of a multi-row statement into its calls. A
// Reserve call the statement did not settle (its row needs a rewrite, or
// appeared after the statement's snapshot) runs alone afterwards; a
// Complete call whose row the statement did not update lost its lease, as
// the single statement would have found.
func readMany(br pgx.BatchResults, reserve bool, ops []*batchOp) error {
	rows, err := br.Query()
	if err != nil {
		for _, op := range ops {
			op.err = err
		}
		return err
	}
	done := make([]bool, len(ops))
	var scanErr error
	for scanErr == nil && rows.Next() {
		var ord int64
		var op *batchOp
		if reserve {
			var rec store.Record
			var action string
			if scanErr = scanRecord(ordRow{rows, &ord}, &rec, &action); scanErr != nil {
				break
			}
			if ord < 1 || int(ord) > len(ops) {
				continue
			}
			op = ops[ord-1]
			if action != "retry" {
				op.rec, op.action = rec, action
				done[ord-1] = true
			}
			continue
		}
		if scanErr = rows.Scan(&ord); scanErr != nil {
			break
		}
		if ord >= 1 && int(ord) <= len(ops) {
			done[ord-1] = true
		}
	}
	rows.Close()
	if err := cmp.Or(rows.Err(), scanErr); err != nil {
		for _, op := range ops {
			op.err = err
		}
		return err
	}
	for i, op := range ops {
		switch {
		case reserve && !done[i]:
			op.runAlone = true
		case !reserve && done[i]:
			op.tag = pgconn.NewCommandTag("UPDATE 1")
		case !reserve:
			op.tag = pgconn.NewCommandTag("UPDATE 0")
		}
	}
	return nil
}

// ordRow reads a row of a multi-row statement: its input position first,
// then what scanRecord reads.
type ordRow struct {
	rows pgx.Rows
	ord  *int64
}

func (r ordRow) Scan(dest ...any) error {
	return r.rows.Scan(append([]any{r.ord}, dest...)...)
}

// runOne runs op's statement by itself on q.
func (s *Store) runOne(ctx context.Context, q querier, op *batchOp) {
	op.err = s.acknowledged(ctx, q, func(q querier) (err error) {
		switch {
		case op.returns && s.partitioned():
			// A Reserve: after its key's lock (partition.go).
			return s.lockedRow(ctx, q, nil, op.args[0].(string), op.args[1].(string), op.sql, op.args,
				func(row pgx.Row) error { return scanRecord(row, &op.rec, &op.action) })
		case op.returns:
			return scanRecord(q.QueryRow(ctx, op.sql, op.args...), &op.rec, &op.action)
		}
		op.tag, err = q.Exec(ctx, op.sql, op.args...)
		return err
	})
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
