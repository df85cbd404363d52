package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Reserve implements [store.Store]. A replay (or any other answer that
// changes nothing) is read from the read pool without taking the write
// lock; everything else runs in one immediate transaction.
func (s *Store) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	if s.reader != s.db {
		// Linearisable: the record was in this state at the instant of the
		// read, and an Existing answer is what Reserve returns at that
		// instant.
		rec, err := getRecord(ctx, s.read(), p.Scope, p.Key)
		switch {
		case err == nil && storekit.Decide(&rec, &p, s.now()) == storekit.ActExisting:
			return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return store.ReserveResult{}, wrap("reserve", err)
		}
	}
	var res store.ReserveResult
	err := s.write(ctx, true, func(ctx context.Context, tx querier) error {
		var err error
		res, err = s.reserve(ctx, tx, &p)
		return err
	})
	if err != nil {
		return store.ReserveResult{}, wrap("reserve", err)
	}
	return res, nil
}

// ReserveTx is Reserve inside the caller's transaction, which must be
// immediate (begun on [Store.DB]) for the reservation to be atomic.
func (s *Store) ReserveTx(ctx context.Context, tx *sql.Tx, p store.ReserveParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	res, err := s.reserve(ctx, tx, &p)
	if err != nil {
		return store.ReserveResult{}, wrap("reserve", err)
	}
	return res, nil
}

// reserve must run in an immediate transaction: nothing may change the row
// between the statements.
func (s *Store) reserve(ctx context.Context, q querier, p *store.ReserveParams) (store.ReserveResult, error) {
	now := s.now()
	lockedUntil := after(now, p.Lease)
	expiresAt := after(now, p.TTL)
	if p.MaxActive > 0 {
		if err := overCap(ctx, q, p, now); err != nil {
			return store.ReserveResult{}, err
		}
	}

	// The common case, a new key, is this one statement.
	rec, err := scanRecord(q.QueryRowContext(ctx, qCreate,
		p.Scope, p.Key, p.Fingerprint, string(p.LeasePolicy), lockedUntil, now.UnixMicro(), expiresAt, p.Tenant, p.Owner))
	if err == nil {
		return store.ReserveResult{Outcome: store.Created, Record: rec}, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.ReserveResult{}, err
	}

	rec, err = getRecord(ctx, q, p.Scope, p.Key)
	if err != nil {
		return store.ReserveResult{}, errChanged(err)
	}
	var (
		outcome = store.Existing
		query   string
		args    []any
	)
	switch storekit.Decide(&rec, p, now) {
	case storekit.ActExisting:
		return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
	case storekit.ActReclaim:
		outcome, query = store.Reclaimed, qReclaim
		args = []any{p.Scope, p.Key, p.Fingerprint, lockedUntil, now.UnixMicro(), expiresAt, p.Owner}
	case storekit.ActTakeOver:
		outcome, query = store.TakenOver, qTakeOver
		args = []any{p.Scope, p.Key, p.Fingerprint, lockedUntil, now.UnixMicro(), p.Owner}
	case storekit.ActLeaseExpired:
		query = qLeaseExpired
		args = []any{p.Scope, p.Key, now.UnixMicro()}
	default: // ActCreate: qCreate would have taken it
		return store.ReserveResult{}, errChanged(nil)
	}
	rec, err = scanRecord(q.QueryRowContext(ctx, query, args...))
	if err != nil {
		return store.ReserveResult{}, errChanged(err)
	}
	return store.ReserveResult{Outcome: outcome, Record: rec}, nil
}

// overCap refuses a reservation that would make one more record of the
// tenant active while it holds p.MaxActive. The immediate transaction
// makes the count and the write one step: no other writer runs between.
func overCap(ctx context.Context, q querier, p *store.ReserveParams, now time.Time) error {
	act := storekit.ActCreate
	rec, err := getRecord(ctx, q, p.Scope, p.Key)
	switch {
	case err == nil:
		act = storekit.Decide(&rec, p, now)
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	return storekit.CheckCap(p, act, activeOf(ctx, q, p.Tenant))
}

// activeOf counts the tenant's active records, for
// storekit.CheckCap.
func activeOf(ctx context.Context, q querier, tenant string) func() (int, error) {
	return func() (n int, err error) {
		err = q.QueryRowContext(ctx, qActive, tenant).Scan(&n)
		return n, err
	}
}

// errChanged reports a row that changed between two statements of reserve,
// which only a transaction that is not immediate allows.
func errChanged(err error) error {
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return errors.New("record changed during the transaction (is it an immediate transaction begun on Store.DB?)")
}

// Complete implements [store.Store].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	return s.write(ctx, false, func(ctx context.Context, q querier) error { return s.complete(ctx, q, &p) })
}

// CompleteTx is Complete inside the caller's transaction: the response is
// stored only if the transaction commits.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p store.CompleteParams) error {
	return s.complete(ctx, tx, &p)
}

func (s *Store) complete(ctx context.Context, q querier, p *store.CompleteParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	resp, err := encodeResponse(&p.Response)
	if err != nil {
		return err
	}
	now := s.now()
	return fenced(ctx, q, "complete", qComplete, now.UnixMicro(), p.Fence,
		resp.status, resp.headers, resp.body, resp.omitted, newExpiry(now, p.TTL), p.Scope, p.Key)
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return fenced(ctx, s.writer(), "release", qRelease, p.Scope, p.Key, p.Fence,
		p.Error, s.now().UnixMicro())
}

// MarkUnknown implements [store.Store].
func (s *Store) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	req, err := storekit.EncodeRequest(p.Request)
	if err != nil {
		return err
	}
	return fenced(ctx, s.writer(), "mark unknown", qMarkUnknown, p.Scope, p.Key, p.Fence,
		p.Error, s.now().UnixMicro(), req)
}

// Checkpoint implements [store.Store].
func (s *Store) Checkpoint(ctx context.Context, p store.CheckpointParams) error {
	return s.checkpoint(ctx, s.writer(), &p)
}

// CheckpointTx is Checkpoint inside the caller's transaction, so a phase's
// writes and its recovery point commit together.
func (s *Store) CheckpointTx(ctx context.Context, tx *sql.Tx, p store.CheckpointParams) error {
	return s.checkpoint(ctx, tx, &p)
}

func (s *Store) checkpoint(ctx context.Context, q querier, p *store.CheckpointParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return fenced(ctx, q, "checkpoint", qCheckpoint, p.Scope, p.Key, p.Fence,
		p.RecoveryPoint, s.now().UnixMicro())
}

// Extend implements [store.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	now := s.now()
	return fenced(ctx, s.writer(), "extend", qExtend, p.Scope, p.Key, p.Fence,
		after(now, p.Lease), now.UnixMicro())
}

// fenced runs one of the lease holder's guarded updates.
func fenced(ctx context.Context, q querier, op, query string, args ...any) error {
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wrap(op, err)
	}
	if n == 0 {
		return fmt.Errorf("idem/sqlite: %s: %w", op, store.ErrLeaseLost)
	}
	return nil
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := store.CheckID(scope, key); err != nil {
		return store.Record{}, err
	}
	rec, err := scanPending(s.read().QueryRowContext(ctx, qGetWithRequest, scope, key))
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	return rec, nil
}

func getRecord(ctx context.Context, q querier, scope, key string) (store.Record, error) {
	return scanRecord(q.QueryRowContext(ctx, qGet, scope, key))
}

// Delete implements [store.Store]. The statement checks the state and
// fence; only a miss (the operator's path) reads the record, in the same
// transaction, to tell why.
func (s *Store) Delete(ctx context.Context, p store.DeleteParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	err := s.inTx(ctx, func(tx querier) error {
		n, err := execCount(ctx, tx, qDelete, p.Scope, p.Key, p.Fence)
		if err != nil || n > 0 {
			return err
		}
		return missed(ctx, tx, p.Scope, p.Key, p.Fence)
	})
	if err != nil {
		return wrap("delete", err)
	}
	return nil
}

// SweepExpiredLeases implements [store.Store]. One statement selects and
// moves the batch, so concurrent sweepers never move a record twice.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	now := s.now()
	recs, err := queryRecords(ctx, s.writer(), qSweep, now.UnixMicro(), p.Limit,
		now.UnixMicro()-storekit.Micros(p.Grace))
	if err != nil {
		return nil, wrap("sweep", err)
	}
	return recs, nil
}

// Reap implements [store.Store]. Terminal records go first; abandoned ones
// use what is left of the limit. Both statements select their batch by the
// partial indexes on expires_at, so a call holds the write lock only for
// p.Limit rows.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReapResult{}, err
	}
	resp, err := encodeResponse(&p.Abandoned)
	if err != nil {
		return store.ReapResult{}, err
	}
	var out store.ReapResult
	err = s.inTx(ctx, func(tx querier) error {
		now := s.now()
		terminal := qReapDelete
		if p.Soft {
			terminal = qReapSoft
		}
		n, err := execCount(ctx, tx, terminal, now.UnixMicro(), p.Limit)
		if err != nil {
			return err
		}
		out.Deleted = n
		if left := p.Limit - n; left > 0 {
			out.Abandoned, err = execCount(ctx, tx, qReapAbandon, now.UnixMicro(), left,
				resp.status, resp.headers, resp.body, resp.omitted, after(now, p.AbandonedTTL),
				now.UnixMicro()-storekit.Micros(p.Grace))
		}
		return err
	})
	if err != nil {
		return store.ReapResult{}, wrap("reap", err)
	}
	return out, nil
}

func execCount(ctx context.Context, q querier, query string, args ...any) (int, error) {
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// ListUnknown implements [store.Store].
func (s *Store) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var (
		recs []store.Record
		err  error
	)
	if p.DueOnly {
		recs, err = queryRecords(ctx, s.read(), qListUnknownDue, s.now().UnixMicro(), p.Limit)
	} else {
		recs, err = queryRecords(ctx, s.read(), qListUnknownAll, p.Limit)
	}
	if err != nil {
		return nil, wrap("list unknown", err)
	}
	return recs, nil
}

// Resolve implements [store.Store].
func (s *Store) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	var resp encodedResponse // NULLs: failed_retryable keeps no response
	var completedAt sql.NullInt64
	now := s.now()
	if p.To == store.StateCompleted {
		var err error
		if resp, err = encodeResponse(p.Response); err != nil {
			return err
		}
		completedAt = sql.NullInt64{Int64: now.UnixMicro(), Valid: true}
	}
	return s.settle(ctx, "resolve", p.Scope, p.Key, p.Fence, qResolve, now.UnixMicro(), p.Fence,
		resp.status, resp.headers, resp.body, resp.omitted, newExpiry(now, p.TTL), p.Scope, p.Key, string(p.To), completedAt)
}

// Defer implements [store.Store].
func (s *Store) Defer(ctx context.Context, p store.DeferParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	now := s.now()
	if p.DeadLetter {
		return s.settle(ctx, "dead letter", p.Scope, p.Key, p.Fence, qDeadLetter, p.Scope, p.Key,
			now.UnixMicro(), p.Error, p.Fence, p.Attempts)
	}
	return s.settle(ctx, "defer", p.Scope, p.Key, p.Fence, qDefer, p.Scope, p.Key,
		after(now, p.Delay), p.Error, now.UnixMicro(), p.Fence, p.Attempts)
}

// settle runs an update guarded by state = 'unknown' and by the record's
// fence (and whatever else the query checks) and, when it changes nothing,
// tells ErrNotFound from ErrLeaseLost and ErrStateConflict within the same
// transaction.
func (s *Store) settle(ctx context.Context, op, scope, key string, fence int64, query string, args ...any) error {
	err := s.inTx(ctx, func(tx querier) error {
		n, err := execCount(ctx, tx, query, args...)
		if err != nil || n > 0 {
			return err
		}
		return missed(ctx, tx, scope, key, fence)
	})
	if err != nil {
		return wrap(op, err)
	}
	return nil
}

// missed tells why a statement guarded by the record's state and fence
// matched nothing, from the record as tx sees it: ErrNotFound,
// ErrLeaseLost (another fence; fence 0, Delete's, takes any) or
// ErrStateConflict (the state, or what else the statement checks).
func missed(ctx context.Context, tx querier, scope, key string, fence int64) error {
	var state string
	var got int64
	switch err := tx.QueryRowContext(ctx, qState, scope, key).Scan(&state, &got); {
	case errors.Is(err, sql.ErrNoRows):
		return store.ErrNotFound
	case err != nil:
		return err
	case fence > 0 && got != fence:
		return fmt.Errorf("%w: the record's fence is %d, not %d", store.ErrLeaseLost, got, fence)
	}
	return fmt.Errorf("%w: state is %s", store.ErrStateConflict, state)
}

// wrap prefixes an error with the operation and marks the transient ones
// retryable (store.IsRetryable): SQLITE_BUSY, another process held the write
// lock past the busy timeout, and SQLITE_LOCKED, a conflict inside this
// process's shared cache; both roll back only the failed statement or
// transaction.
func wrap(op string, err error) error {
	if busy(err) {
		err = store.Retryable(err)
	}
	return fmt.Errorf("idem/sqlite: %s: %w", op, err)
}

// busy reports whether err is SQLITE_BUSY or SQLITE_LOCKED (see wrap).
func busy(err error) bool {
	var e *msqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// after is now plus d in unix microseconds, d rounded up as every store
// rounds durations.
func after(now time.Time, d time.Duration) int64 { return now.UnixMicro() + storekit.Micros(d) }

// newExpiry is the expires_at a write sets: now plus ttl, or NULL (keep
// the record's) for a ttl of zero.
func newExpiry(now time.Time, ttl time.Duration) sql.NullInt64 {
	if ttl <= 0 {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: after(now, ttl), Valid: true}
}

// encodedResponse is a store.Response as bound to the response_* columns.
type encodedResponse struct {
	status  sql.NullInt64
	headers sql.NullString // JSON; NULL for a nil header
	body    []byte         // nil binds NULL
	omitted bool
}

func encodeResponse(r *store.Response) (encodedResponse, error) {
	e := encodedResponse{
		status:  sql.NullInt64{Int64: int64(r.Status), Valid: true},
		omitted: r.BodyOmitted,
	}
	if r.Header != nil {
		b, err := json.Marshal(r.Header)
		if err != nil {
			return encodedResponse{}, fmt.Errorf("idem/sqlite: encode headers: %w", err)
		}
		e.headers = sql.NullString{String: string(b), Valid: true}
	}
	if !r.BodyOmitted {
		e.body = r.Body // nil binds NULL, empty binds an empty BLOB
	}
	return e, nil
}

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads the columns of recordColumns. sql.ErrNoRows becomes
// store.ErrNotFound.
func scanRecord(sc scanner) (store.Record, error) {
	var (
		r                                      store.Record
		state, policy                          string
		lockedUntil, createdAt, updatedAt, exp int64
		completedAt, reconcileAfter, status    sql.NullInt64
		deadLetteredAt, owner                  sql.NullInt64
		headers                                sql.NullString
		body                                   []byte
		bodyNull, omitted                      bool
	)
	err := sc.Scan(&r.Scope, &r.Key, &r.Fingerprint, &state, &r.Fence, &policy, &lockedUntil,
		&r.RecoveryPoint, &status, &headers, &body, &bodyNull, &omitted,
		&r.LastError, &r.Attempts, &createdAt, &updatedAt, &completedAt, &exp,
		&reconcileAfter, &r.ReconcileAttempts, &deadLetteredAt, &owner)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	if err != nil {
		return store.Record{}, err
	}
	r.State = store.State(state)
	r.LeasePolicy = store.LeasePolicy(policy)
	r.LockedUntil = fromMicros(lockedUntil)
	r.CreatedAt = fromMicros(createdAt)
	r.UpdatedAt = fromMicros(updatedAt)
	r.ExpiresAt = fromMicros(exp)
	r.CompletedAt = fromNullMicros(completedAt)
	r.ReconcileAfter = fromNullMicros(reconcileAfter)
	r.DeadLetteredAt = fromNullMicros(deadLetteredAt)
	r.Owner = owner.Int64 // NULL (0): no Reserve started it, or it predates migration 011
	if status.Valid {
		r.Response = &store.Response{Status: int(status.Int64), BodyOmitted: omitted}
		if !omitted && !bodyNull && body == nil {
			body = []byte{}
		}
		r.Response.Body = body
		if headers.Valid {
			if err := json.Unmarshal([]byte(headers.String), &r.Response.Header); err != nil {
				return store.Record{}, fmt.Errorf("decode headers: %w", err)
			}
		}
	}
	return r, nil
}

func queryRecords(ctx context.Context, q querier, query string, args ...any) ([]store.Record, error) {
	return queryWith(ctx, q, scanRecord, query, args...)
}

// queryWith runs query and reads every row with scan.
func queryWith(ctx context.Context, q querier, scan func(scanner) (store.Record, error), query string, args ...any) ([]store.Record, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Record
	for rows.Next() {
		rec, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}

func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

func fromNullMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMicros(v.Int64)
}

// CountActive implements [store.ActiveCounter].
func (s *Store) CountActive(ctx context.Context, limit int) (int, error) {
	if err := store.CheckActiveLimit(limit); err != nil {
		return 0, err
	}
	var n int
	if err := s.read().QueryRowContext(ctx, qCountActive, limit).Scan(&n); err != nil {
		return 0, wrap("count active", err)
	}
	return n, nil
}
