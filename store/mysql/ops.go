package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// The columns of migrations/001_records.sql hold the contract's limits
// (store.MaxScopeBytes, MaxKeyBytes, MaxFingerprintBytes), which the
// parameters' Validate checks before any statement: a server without strict
// sql_mode would truncate silently.

// Reserve decisions, as left in LAST_INSERT_ID by the reserve_upsert query.
const (
	decisionExisting = 0
	decisionCreated  = 1
	decisionReclaim  = 2
	decisionTakeover = 3
	decisionUnknown  = 4 // lease expired under policy unknown: Existing
)

func (s *Store) idArgs(scope, key string) args {
	return args{"scope": scope, "key": key, "now": s.nowArg()}
}

// Reserve implements [store.Store.Reserve] in one round trip on a store from
// Open (see the package documentation), retrying deadlocks and insert races.
func (s *Store) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	var res store.ReserveResult
	err := s.retry(ctx, transient, func() error {
		var err error
		if p.MaxActive > 0 {
			res, err = s.reserveCapped(ctx, p)
		} else if s.batch {
			res, err = s.reserveBatch(ctx, p)
		} else {
			res, err = s.reserveOwnTx(ctx, p)
		}
		return err
	})
	return res, wrap("reserve", err)
}

// ReserveTx runs Reserve's statements in the caller's transaction. A 1062
// race is retried in place; a deadlock (1213) has rolled tx back and is
// returned for the caller to retry its transaction. With a positive
// p.MaxActive it holds, until tx ends, the tenant's lock and a share lock
// on the tenant's active records: their holders' completions wait for tx.
func (s *Store) ReserveTx(ctx context.Context, tx *sql.Tx, p store.ReserveParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	var res store.ReserveResult
	err := s.retry(ctx, duplicateKey, func() error {
		var err error
		if p.MaxActive > 0 {
			res, err = s.reserveCappedIn(ctx, tx, p, qTenantCheckLocked)
		} else {
			res, err = s.reserveIn(ctx, tx, p)
		}
		return err
	})
	return res, wrap("reserve", err)
}

func (s *Store) reserveArgs(p store.ReserveParams) args {
	a := s.idArgs(p.Scope, p.Key)
	a["fingerprint"] = p.Fingerprint
	a["lease_policy"] = string(p.LeasePolicy)
	a["lease_us"] = storekit.Micros(p.Lease)
	a["ttl_us"] = storekit.Micros(p.TTL)
	a["tenant"] = p.Tenant
	a["owner"] = p.Owner
	return a
}

// reserveIn runs the upsert and the read of its row as two statements on q,
// which must keep one session (a transaction or a pinned connection) so
// that the read sees the upsert's LAST_INSERT_ID.
func (s *Store) reserveIn(ctx context.Context, q querier, p store.ReserveParams) (store.ReserveResult, error) {
	return reserveWith(ctx, q, s.reserveArgs(p))
}

// reserveWith is reserveIn with its arguments (reserveArgs) given.
func reserveWith(ctx context.Context, q querier, a args) (store.ReserveResult, error) {
	up, err := qReserveUpsert.bind(a)
	if err != nil {
		return store.ReserveResult{}, err
	}
	sel, err := qReserveSelect.bind(a)
	if err != nil {
		return store.ReserveResult{}, err
	}
	if _, err := q.ExecContext(ctx, qReserveUpsert.sql, up...); err != nil {
		return store.ReserveResult{}, err
	}
	rows, err := q.QueryContext(ctx, qReserveSelect.sql, sel...)
	if err != nil {
		return store.ReserveResult{}, err
	}
	return readReserve(rows)
}

// reserveOwnTx is Reserve on a pool without multi-statement support.
func (s *Store) reserveOwnTx(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	tx, err := s.q.BeginTx(ctx, nil)
	if err != nil {
		return store.ReserveResult{}, err
	}
	res, err := s.reserveIn(ctx, tx, p)
	if err != nil {
		_ = tx.Rollback()
		return store.ReserveResult{}, err
	}
	return res, tx.Commit()
}

// reserveBatch sends the whole transaction as one multi-statement query on a
// pinned connection. The server stops at the first failing statement, which
// leaves the transaction open (a deadlock has already rolled it back, a lock
// wait timeout has not): the connection gets a ROLLBACK before it returns to
// the pool, or is discarded.
func (s *Store) reserveBatch(ctx context.Context, p store.ReserveParams) (res store.ReserveResult, err error) {
	a, err := qReserveBatch.bind(s.reserveArgs(p))
	if err != nil {
		return store.ReserveResult{}, err
	}
	conn, err := s.q.Conn(ctx)
	if err != nil {
		return store.ReserveResult{}, err
	}
	defer func() {
		if err != nil {
			rollbackOrDiscard(ctx, conn)
		}
		_ = conn.Close()
	}()
	rows, err := conn.QueryContext(ctx, qReserveBatch.sql, a...)
	if err != nil {
		return store.ReserveResult{}, err
	}
	// readReserve closes rows, which reads the COMMIT's answer: a failed
	// commit is an error here, never a silent success.
	return readReserve(rows)
}

// rollbackOrDiscard ends whatever transaction a failed batch left open on
// conn, and discards the connection when even that fails.
func rollbackOrDiscard(ctx context.Context, conn *sql.Conn) {
	rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(rbCtx, qRollback.sql); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

func readReserve(rows *sql.Rows) (store.ReserveResult, error) {
	var (
		decision int64
		rec      store.Record
		found    bool
		err      error
	)
	for rows.Next() {
		rec, err = scanRecord(rows, []any{&decision})
		if err != nil {
			_ = rows.Close()
			return store.ReserveResult{}, err
		}
		found = true
	}
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return store.ReserveResult{}, err
	}
	if err := rows.Close(); err != nil {
		return store.ReserveResult{}, err
	}
	if !found {
		// The upsert holds the row's lock until commit, so it cannot vanish.
		return store.ReserveResult{}, errors.New("reserved row not found")
	}
	out := store.ReserveResult{Record: rec}
	switch decision {
	case decisionExisting, decisionUnknown:
		out.Outcome = store.Existing
	case decisionCreated:
		out.Outcome = store.Created
	case decisionReclaim:
		out.Outcome = store.Reclaimed
	case decisionTakeover:
		out.Outcome = store.TakenOver
	default:
		return store.ReserveResult{}, fmt.Errorf("reserve decision %d is not one of reserve_upsert's", decision)
	}
	return out, nil
}

// fenced runs one UPDATE guarded by state = 'in_progress' AND fence = ?.
// Every such UPDATE bumps row_version, so a match is always a change and
// the affected-rows count is right with or without clientFoundRows.
func (s *Store) fenced(ctx context.Context, q querier, op string, qq *query, a args) error {
	bound, err := qq.bind(a)
	if err != nil {
		return wrap(op, err)
	}
	var n int64
	run := func() error {
		res, err := q.ExecContext(ctx, qq.sql, bound...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	}
	if _, inTx := q.(*sql.Tx); inTx {
		// A deadlock has rolled the caller's whole transaction back: only
		// the caller can run it again.
		err = run()
	} else {
		// An autocommit statement that lost a deadlock changed nothing.
		err = s.retry(ctx, transient, run)
	}
	if err != nil {
		return wrap(op, err)
	}
	if n == 0 {
		return store.ErrLeaseLost
	}
	return nil
}

// fenceArgs binds a lease holder's identity once its parameters passed
// their Validate (valid).
func (s *Store) fenceArgs(valid error, f store.FenceParams) (args, error) {
	if valid != nil {
		return nil, valid
	}
	a := s.idArgs(f.Scope, f.Key)
	a["fence"] = f.Fence
	return a, nil
}

// Complete implements [store.Store.Complete].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	return s.complete(ctx, s.q, p)
}

// CompleteTx is Complete inside the caller's transaction.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p store.CompleteParams) error {
	return s.complete(ctx, tx, p)
}

func (s *Store) complete(ctx context.Context, q querier, p store.CompleteParams) error {
	a, err := s.fenceArgs(p.Validate(), p.FenceParams)
	if err != nil {
		return err
	}
	if err := responseArgs(a, &p.Response); err != nil {
		return err
	}
	a["ttl_us"] = storekit.Micros(p.TTL)
	return s.fenced(ctx, q, "complete", qComplete, a)
}

// Release implements [store.Store.Release].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	a, err := s.fenceArgs(p.Validate(), p.FenceParams)
	if err != nil {
		return err
	}
	a["error"] = p.Error
	return s.fenced(ctx, s.q, "release", qRelease, a)
}

// MarkUnknown implements [store.Store.MarkUnknown].
func (s *Store) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	a, err := s.fenceArgs(p.Validate(), p.FenceParams)
	if err != nil {
		return err
	}
	a["error"] = p.Error
	if a["request"], err = storekit.EncodeRequest(p.Request); err != nil {
		return err
	}
	return s.fenced(ctx, s.q, "mark unknown", qMarkUnknown, a)
}

// Checkpoint implements [store.Store.Checkpoint].
func (s *Store) Checkpoint(ctx context.Context, p store.CheckpointParams) error {
	return s.checkpoint(ctx, s.q, p)
}

// CheckpointTx is Checkpoint inside the caller's transaction, so the phase's
// business writes and the new recovery point commit together.
func (s *Store) CheckpointTx(ctx context.Context, tx *sql.Tx, p store.CheckpointParams) error {
	return s.checkpoint(ctx, tx, p)
}

func (s *Store) checkpoint(ctx context.Context, q querier, p store.CheckpointParams) error {
	a, err := s.fenceArgs(p.Validate(), p.FenceParams)
	if err != nil {
		return err
	}
	a["recovery_point"] = p.RecoveryPoint
	return s.fenced(ctx, q, "checkpoint", qCheckpoint, a)
}

// Extend implements [store.Store.Extend].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	a, err := s.fenceArgs(p.Validate(), p.FenceParams)
	if err != nil {
		return err
	}
	a["lease_us"] = storekit.Micros(p.Lease)
	return s.fenced(ctx, s.q, "extend", qExtend, a)
}

// Get implements [store.Store.Get].
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := store.CheckID(scope, key); err != nil {
		return store.Record{}, err
	}
	a, err := qGet.bind(s.idArgs(scope, key))
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	rec, err := scanPending(s.q.QueryRowContext(ctx, qGet.sql, a...))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	return rec, wrap("get", err)
}

// Delete implements [store.Store.Delete].
func (s *Store) Delete(ctx context.Context, p store.DeleteParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	a := s.idArgs(p.Scope, p.Key)
	a["fence"] = p.Fence
	return s.guarded(ctx, "delete", qDelete, a, p.Fence)
}

// exec runs an autocommit statement on the store's pool, retrying
// deadlocks, and returns the affected rows.
func (s *Store) exec(ctx context.Context, qq *query, a args) (int64, error) {
	bound, err := qq.bind(a)
	if err != nil {
		return 0, err
	}
	var n int64
	err = s.retry(ctx, transient, func() error {
		res, err := s.q.ExecContext(ctx, qq.sql, bound...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// SweepExpiredLeases implements [store.Store.SweepExpiredLeases]. The batch
// is locked with FOR UPDATE SKIP LOCKED in a READ COMMITTED transaction (no
// gap locks), so concurrent sweepers take disjoint batches and never wait
// for each other. It costs one round trip per swept record plus four.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out []store.Record
	err := s.retry(ctx, transient, func() error {
		var err error
		out, err = s.sweepOnce(ctx, p)
		return err
	})
	return out, wrap("sweep", err)
}

func (s *Store) sweepOnce(ctx context.Context, p store.SweepParams) (_ []store.Record, err error) {
	tx, err := s.q.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	sel, err := qSweepSelect.bind(args{"now": s.nowArg(), "limit": p.Limit, "grace_us": storekit.Micros(p.Grace)})
	if err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, qSweepSelect.sql, sel...)
	if err != nil {
		return nil, err
	}
	var now dbTime
	recs, err := collect(rows, func(sc scanner) (store.Record, error) { return scanRecord(sc, nil, &now) })
	if err != nil {
		return nil, err
	}
	for i := range recs {
		r := &recs[i]
		a, err := qSweepUpdate.bind(args{
			"scope": r.Scope, "key": r.Key, "fence": r.Fence,
			"now": now.t.Format(datetimeLayout),
		})
		if err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(ctx, qSweepUpdate.sql, a...)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			// The row is locked by this transaction: a miss is a bug.
			return nil, errors.Join(err, fmt.Errorf("swept record %q/%q changed under its lock", r.Scope, r.Key))
		}
		r.State = store.StateUnknown
		r.LastError = "lease_expired"
		r.ReconcileAfter = now.t
		r.UpdatedAt = now.t
	}
	return recs, tx.Commit()
}

// Reap implements [store.Store.Reap] with single-statement batches (DELETE
// or UPDATE ... LIMIT) in one READ COMMITTED transaction, so no statement
// holds gap locks on the expiry index while it works.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReapResult{}, err
	}
	abandon := args{"now": s.nowArg(), "ttl_us": storekit.Micros(p.AbandonedTTL), "grace_us": storekit.Micros(p.Grace)}
	if err := responseArgs(abandon, &p.Abandoned); err != nil {
		return store.ReapResult{}, err
	}
	var out store.ReapResult
	err := s.retry(ctx, transient, func() error {
		var err error
		out, err = s.reapOnce(ctx, p, abandon)
		return err
	})
	return out, wrap("reap", err)
}

func (s *Store) reapOnce(ctx context.Context, p store.ReapParams, abandon args) (_ store.ReapResult, err error) {
	var out store.ReapResult
	tx, err := s.q.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return out, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	run := func(qq *query, a args) (int, error) {
		n, err := runIn(ctx, tx, qq, a)
		return int(n), err
	}
	// Terminal records first: an abandoned record given a zero TTL must not
	// be deleted by the same call that created it.
	terminal := qReapDelete
	if p.Soft {
		terminal = qReapSoft
	}
	if out.Deleted, err = run(terminal, args{"now": s.nowArg(), "limit": p.Limit}); err != nil {
		return out, err
	}
	if left := p.Limit - out.Deleted; left > 0 {
		abandon["limit"] = left
		if out.Abandoned, err = run(qReapAbandon, abandon); err != nil {
			return out, err
		}
	}
	return out, tx.Commit()
}

// ListUnknown implements [store.Store.ListUnknown].
func (s *Store) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	qq := qListUnknownAll
	if p.DueOnly {
		qq = qListUnknownDue
	}
	a, err := qq.bind(args{"now": s.nowArg(), "limit": p.Limit})
	if err != nil {
		return nil, wrap("list unknown", err)
	}
	rows, err := s.q.QueryContext(ctx, qq.sql, a...)
	if err != nil {
		return nil, wrap("list unknown", err)
	}
	out, err := collect(rows, scanPlain)
	return out, wrap("list unknown", err)
}

// Resolve implements [store.Store.Resolve].
func (s *Store) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	a := s.idArgs(p.Scope, p.Key)
	a["to"] = string(p.To)
	a["ttl_us"] = storekit.Micros(p.TTL)
	a["fence"] = p.Fence
	var resp *store.Response
	if p.To == store.StateCompleted {
		resp = p.Response
	}
	if err := responseArgs(a, resp); err != nil {
		return err
	}
	return s.guarded(ctx, "resolve", qResolve, a, p.Fence)
}

// Defer implements [store.Store.Defer].
func (s *Store) Defer(ctx context.Context, p store.DeferParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	a := s.idArgs(p.Scope, p.Key)
	a["error"] = p.Error
	a["fence"] = p.Fence
	a["attempts"] = p.Attempts
	if p.DeadLetter {
		return s.guarded(ctx, "dead letter", qDeadLetter, a, p.Fence)
	}
	a["delay_us"] = storekit.Micros(p.Delay)
	return s.guarded(ctx, "defer", qDefer, a, p.Fence)
}

// guarded runs a statement guarded by the record's state and by its
// fence (fence 0, Delete's, takes any), and whatever else the query
// checks: Resolve and Defer need an unknown record, Delete one not in
// progress. Only when it matches nothing does a transaction tell
// ErrNotFound from ErrLeaseLost and ErrStateConflict: it locks the row,
// runs the statement again and, when it still matches nothing, explains
// the miss by the row it holds. A read on its own would see whatever
// committed since the miss, and could explain it by a record the
// statement never saw: a Delete that found none would answer that the
// record created and completed meanwhile is in the wrong state.
func (s *Store) guarded(ctx context.Context, op string, qq *query, a args, fence int64) error {
	n, err := s.exec(ctx, qq, a)
	if err != nil {
		return wrap(op, err)
	}
	if n > 0 {
		return nil
	}
	sa, err := qState.bind(a)
	if err != nil {
		return wrap(op, err)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var state string
		var got int64
		switch err := tx.QueryRowContext(ctx, qState.sql, sa...).Scan(&state, &got); {
		case errors.Is(err, sql.ErrNoRows):
			return store.ErrNotFound
		case err != nil:
			return err
		}
		if n, err := runIn(ctx, tx, qq, a); err != nil || n > 0 {
			return err
		}
		if fence > 0 && got != fence {
			return fmt.Errorf("%w: the record's fence is %d, not %d", store.ErrLeaseLost, got, fence)
		}
		// The fence is the caller's: the record is not in the state the
		// query needs, or what else it checks (Defer's attempts) has moved on.
		return fmt.Errorf("%w: record is %s", store.ErrStateConflict, state)
	})
	return wrap(op, err)
}
