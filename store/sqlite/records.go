package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/store"
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
		case err == nil && decide(&rec, s.now(), &p) == actExisting:
			return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return store.ReserveResult{}, fmt.Errorf("idem/sqlite: reserve: %w", err)
		}
	}
	var res store.ReserveResult
	err := s.inTx(ctx, func(tx querier) error {
		var err error
		res, err = s.reserve(ctx, tx, &p)
		return err
	})
	if err != nil {
		return store.ReserveResult{}, fmt.Errorf("idem/sqlite: reserve: %w", err)
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
		return store.ReserveResult{}, fmt.Errorf("idem/sqlite: reserve: %w", err)
	}
	return res, nil
}

// action is what Reserve does to an existing record.
type action int

const (
	actExisting     action = iota // return it untouched
	actCreate                     // replace it with a new record, a greater fence
	actReclaim                    // failed_retryable -> in_progress
	actTakeOver                   // expired lease, policy retry/resume
	actLeaseExpired               // expired lease, policy unknown -> unknown
)

// decide applies the rules of [store.Store.Reserve] to an existing record,
// in the order of its doc comment.
func decide(r *store.Record, now time.Time, p *store.ReserveParams) action {
	switch {
	case r.State == store.StateExpired || (r.State.Terminal() && !now.Before(r.ExpiresAt)):
		return actCreate
	case r.Fingerprint != p.Fingerprint:
		return actExisting
	case r.State == store.StateFailedRetryable:
		return actReclaim
	case r.LeaseExpired(now):
		if r.LeasePolicy == store.LeaseUnknown {
			return actLeaseExpired
		}
		return actTakeOver
	}
	return actExisting
}

// reserve must run in an immediate transaction: nothing may change the row
// between the statements.
func (s *Store) reserve(ctx context.Context, q querier, p *store.ReserveParams) (store.ReserveResult, error) {
	now := s.now()
	lockedUntil := now.Add(p.Lease).UnixMicro()
	expiresAt := now.Add(p.TTL).UnixMicro()

	// The common case, a new key, is this one statement.
	rec, err := scanRecord(q.QueryRowContext(ctx, qCreate,
		p.Scope, p.Key, p.Fingerprint, string(p.LeasePolicy), lockedUntil, now.UnixMicro(), expiresAt))
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
	switch decide(&rec, now, p) {
	case actExisting:
		return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
	case actReclaim:
		outcome, query = store.Reclaimed, qReclaim
		args = []any{p.Scope, p.Key, p.Fingerprint, lockedUntil, now.UnixMicro(), expiresAt}
	case actTakeOver:
		outcome, query = store.TakenOver, qTakeOver
		args = []any{p.Scope, p.Key, p.Fingerprint, lockedUntil, now.UnixMicro()}
	case actLeaseExpired:
		query = qLeaseExpired
		args = []any{p.Scope, p.Key, now.UnixMicro()}
	default: // actCreate: qCreate would have taken it
		return store.ReserveResult{}, errChanged(nil)
	}
	rec, err = scanRecord(q.QueryRowContext(ctx, query, args...))
	if err != nil {
		return store.ReserveResult{}, errChanged(err)
	}
	return store.ReserveResult{Outcome: outcome, Record: rec}, nil
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
	return s.complete(ctx, s.writer(), &p)
}

// CompleteTx is Complete inside the caller's transaction: the response is
// stored only if the transaction commits.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p store.CompleteParams) error {
	return s.complete(ctx, tx, &p)
}

func (s *Store) complete(ctx context.Context, q querier, p *store.CompleteParams) error {
	if err := validFence(&p.FenceParams); err != nil {
		return err
	}
	if err := validResponse(&p.Response); err != nil {
		return err
	}
	resp, err := encodeResponse(&p.Response)
	if err != nil {
		return err
	}
	now := s.now()
	var expiresAt sql.NullInt64
	if p.TTL > 0 {
		expiresAt = sql.NullInt64{Int64: now.Add(p.TTL).UnixMicro(), Valid: true}
	}
	return fenced(ctx, q, "complete", qComplete, p.Scope, p.Key, p.Fence,
		resp.status, resp.headers, resp.body, resp.omitted, now.UnixMicro(), expiresAt)
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	if err := validFence(&p.FenceParams); err != nil {
		return err
	}
	return fenced(ctx, s.writer(), "release", qRelease, p.Scope, p.Key, p.Fence,
		p.Error, s.now().UnixMicro())
}

// MarkUnknown implements [store.Store].
func (s *Store) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	if err := validFence(&p.FenceParams); err != nil {
		return err
	}
	return fenced(ctx, s.writer(), "mark unknown", qMarkUnknown, p.Scope, p.Key, p.Fence,
		p.Error, s.now().UnixMicro())
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
	if err := validFence(&p.FenceParams); err != nil {
		return err
	}
	return fenced(ctx, q, "checkpoint", qCheckpoint, p.Scope, p.Key, p.Fence,
		p.RecoveryPoint, s.now().UnixMicro())
}

// Extend implements [store.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := validFence(&p.FenceParams); err != nil {
		return err
	}
	if p.Lease <= 0 {
		return invalid("lease must be positive")
	}
	now := s.now()
	return fenced(ctx, s.writer(), "extend", qExtend, p.Scope, p.Key, p.Fence,
		now.Add(p.Lease).UnixMicro(), now.UnixMicro())
}

// fenced runs one of the lease holder's guarded updates.
func fenced(ctx context.Context, q querier, op, query string, args ...any) error {
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("idem/sqlite: %s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idem/sqlite: %s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("idem/sqlite: %s: %w", op, store.ErrLeaseLost)
	}
	return nil
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if scope == "" || key == "" {
		return store.Record{}, invalid("scope and key are required")
	}
	rec, err := getRecord(ctx, s.read(), scope, key)
	if err != nil {
		return store.Record{}, fmt.Errorf("idem/sqlite: get: %w", err)
	}
	return rec, nil
}

func getRecord(ctx context.Context, q querier, scope, key string) (store.Record, error) {
	return scanRecord(q.QueryRowContext(ctx, qGet, scope, key))
}

// Delete implements [store.Store].
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if scope == "" || key == "" {
		return invalid("scope and key are required")
	}
	res, err := s.writer().ExecContext(ctx, qDelete, scope, key)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			// Absent, or in progress: tell which (the operator's path only).
			if _, err = s.Get(ctx, scope, key); err == nil {
				err = store.ErrStateConflict
			}
		}
	}
	if err != nil {
		return fmt.Errorf("idem/sqlite: delete: %w", err)
	}
	return nil
}

// SweepExpiredLeases implements [store.Store]. One statement selects and
// moves the batch, so concurrent sweepers never move a record twice.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	if p.Limit <= 0 {
		return nil, invalid("limit must be positive")
	}
	recs, err := queryRecords(ctx, s.writer(), qSweep, s.now().UnixMicro(), p.Limit)
	if err != nil {
		return nil, fmt.Errorf("idem/sqlite: sweep: %w", err)
	}
	return recs, nil
}

// Reap implements [store.Store]. Terminal records go first; abandoned ones
// use what is left of the limit. Both statements select their batch by the
// partial indexes on expires_at, so a call holds the write lock only for
// p.Limit rows.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	if p.Limit <= 0 {
		return store.ReapResult{}, invalid("limit must be positive")
	}
	if p.AbandonedTTL < 0 {
		return store.ReapResult{}, invalid("abandoned ttl must not be negative")
	}
	if err := validResponse(&p.Abandoned); err != nil {
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
				resp.status, resp.headers, resp.body, resp.omitted, now.Add(p.AbandonedTTL).UnixMicro())
		}
		return err
	})
	if err != nil {
		return store.ReapResult{}, fmt.Errorf("idem/sqlite: reap: %w", err)
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
	if p.Limit <= 0 {
		return nil, invalid("limit must be positive")
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
		return nil, fmt.Errorf("idem/sqlite: list unknown: %w", err)
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
		if err := validResponse(p.Response); err != nil {
			return err
		}
		var err error
		if resp, err = encodeResponse(p.Response); err != nil {
			return err
		}
		completedAt = sql.NullInt64{Int64: now.UnixMicro(), Valid: true}
	}
	var expiresAt sql.NullInt64
	if p.TTL > 0 {
		expiresAt = sql.NullInt64{Int64: now.Add(p.TTL).UnixMicro(), Valid: true}
	}
	return s.settle(ctx, "resolve", p.Scope, p.Key, qResolve, p.Scope, p.Key, string(p.To),
		resp.status, resp.headers, resp.body, resp.omitted, completedAt, now.UnixMicro(), expiresAt)
}

// Defer implements [store.Store].
func (s *Store) Defer(ctx context.Context, p store.DeferParams) error {
	if p.Scope == "" || p.Key == "" {
		return invalid("scope and key are required")
	}
	if p.Delay < 0 {
		return invalid("delay must not be negative")
	}
	now := s.now()
	return s.settle(ctx, "defer", p.Scope, p.Key, qDefer, p.Scope, p.Key,
		now.Add(p.Delay).UnixMicro(), p.Error, now.UnixMicro())
}

// settle runs an update guarded by state = 'unknown' and, when it changes
// nothing, tells ErrNotFound from ErrStateConflict within the same
// transaction.
func (s *Store) settle(ctx context.Context, op, scope, key, query string, args ...any) error {
	err := s.inTx(ctx, func(tx querier) error {
		n, err := execCount(ctx, tx, query, args...)
		if err != nil || n > 0 {
			return err
		}
		var state string
		switch err := tx.QueryRowContext(ctx, qState, scope, key).Scan(&state); {
		case errors.Is(err, sql.ErrNoRows):
			return store.ErrNotFound
		case err != nil:
			return err
		}
		return fmt.Errorf("%w: state is %s", store.ErrStateConflict, state)
	})
	if err != nil {
		return fmt.Errorf("idem/sqlite: %s: %w", op, err)
	}
	return nil
}

func validFence(p *store.FenceParams) error {
	if p.Scope == "" || p.Key == "" {
		return invalid("scope and key are required")
	}
	return nil
}

func validResponse(r *store.Response) error {
	if r.Status < 100 || r.Status > 999 {
		return invalid(fmt.Sprintf("response status %d out of range", r.Status))
	}
	return nil
}

func invalid(msg string) error {
	return fmt.Errorf("idem/sqlite: %w: %s", store.ErrInvalidParams, msg)
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
		headers                                sql.NullString
		body                                   []byte
		bodyNull, omitted                      bool
	)
	err := sc.Scan(&r.Scope, &r.Key, &r.Fingerprint, &state, &r.Fence, &policy, &lockedUntil,
		&r.RecoveryPoint, &status, &headers, &body, &bodyNull, &omitted,
		&r.LastError, &r.Attempts, &createdAt, &updatedAt, &completedAt, &exp,
		&reconcileAfter, &r.ReconcileAttempts)
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
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
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
