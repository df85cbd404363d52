package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var _ store.Queue = (*Store)(nil)
var _ store.ActiveCounter = (*Store)(nil)

// Asynchronous acceptance: the pending record is the queue. Claims and
// expiry lock their batch with FOR UPDATE SKIP LOCKED in a READ COMMITTED
// transaction, as the sweeper does, so workers of any number of instances
// take disjoint batches and never wait for each other. Every transition is
// computed in Go (storekit.ApplyPending, the claim and expiry rules) from the
// row read under its lock and written back whole.

var (
	qPendingNow = mustCompile("pending_now", `SELECT `+sqlNow)

	qPendingLock = mustCompile("pending_lock", `
SELECT {record_columns}, queue, request FROM idem_records
WHERE scope = :scope AND `+"`key`"+` = :key
FOR UPDATE`)

	qPendingInsert = mustCompile("pending_insert", `
INSERT INTO idem_records (scope, `+"`key`"+`, fingerprint, state, fence, lease_policy, locked_until,
    recovery_point, response_status, response_headers, response_body, response_body_omitted,
    last_error, attempts, created_at, updated_at, completed_at, expires_at, reconcile_after,
    reconcile_attempts, dead_lettered_at, queue, request, tenant, owner)
VALUES (:scope, :key, :fingerprint, :state, :fence, :lease_policy, :locked_until,
    :recovery_point, :status, :headers, :body, :body_omitted,
    :last_error, :attempts, :created_at, :updated_at, :completed_at, :expires_at, :reconcile_after,
    :reconcile_attempts, :dead_lettered_at, :queue, :request, :tenant, :owner)`)

	qPendingWrite = mustCompile("pending_write", `
UPDATE idem_records SET
    fingerprint = :fingerprint, state = :state, fence = :fence, lease_policy = :lease_policy,
    locked_until = :locked_until, recovery_point = :recovery_point,
    response_status = :status, response_headers = :headers, response_body = :body,
    response_body_omitted = :body_omitted, last_error = :last_error, attempts = :attempts,
    created_at = :created_at, updated_at = :updated_at, completed_at = :completed_at,
    expires_at = :expires_at, reconcile_after = :reconcile_after,
    reconcile_attempts = :reconcile_attempts, dead_lettered_at = :dead_lettered_at,
    queue = :queue, request = :request, tenant = COALESCE(:tenant, tenant), owner = :owner,
    row_version = row_version + 1
WHERE scope = :scope AND `+"`key`"+` = :key AND fence = :old_fence AND state = :old_state`)

	qClaimSelect = mustCompile("claim_select", `
SELECT {record_columns}, queue, request, `+sqlNow+` FROM idem_records
WHERE state = 'pending' AND queue = :queue AND locked_until > `+sqlNow+`
ORDER BY created_at
LIMIT :limit
FOR UPDATE SKIP LOCKED`)

	qExpireSelect = mustCompile("expire_pending_select", `
SELECT {record_columns}, queue, request, `+sqlNow+` FROM idem_records
WHERE state = 'pending' AND locked_until <= `+sqlNow+`
ORDER BY locked_until
LIMIT :limit
FOR UPDATE SKIP LOCKED`)
)

func dbTimeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(datetimeLayout)
}

// recordArgs are the columns of r as qPendingInsert and qPendingWrite bind
// them.
func recordArgs(r *store.Record) (args, error) {
	a := args{
		"scope": r.Scope, "key": r.Key, "fingerprint": r.Fingerprint, "state": string(r.State),
		"fence": r.Fence, "lease_policy": string(r.LeasePolicy), "locked_until": dbTimeArg(r.LockedUntil),
		"recovery_point": []byte(r.RecoveryPoint), "last_error": []byte(r.LastError), "attempts": r.Attempts,
		"created_at": dbTimeArg(r.CreatedAt), "updated_at": dbTimeArg(r.UpdatedAt),
		"completed_at": dbTimeArg(r.CompletedAt), "expires_at": dbTimeArg(r.ExpiresAt),
		"reconcile_after": dbTimeArg(r.ReconcileAfter), "reconcile_attempts": r.ReconcileAttempts,
		"dead_lettered_at": dbTimeArg(r.DeadLetteredAt), "queue": nil, "request": nil,
		// The Owner storekit.ApplyPending left: 0 on a pending record,
		// which no Reserve started, whatever row it replaces; the row's
		// own where the write is another (a lease expired to unknown).
		"owner": r.Owner,
	}
	if err := responseArgs(a, r.Response); err != nil {
		return nil, err
	}
	if r.Request != nil {
		b, err := storekit.EncodeRequest(r.Request)
		if err != nil {
			return nil, err
		}
		a["request"] = b
		if r.Request.Queue != "" { // a summary (ReleaseParams.Request) has none
			a["queue"] = []byte(r.Request.Queue)
		}
	}
	return a, nil
}

// scanPending reads {record_columns}, queue, request and then trail.
func scanPending(sc scanner, trail ...any) (store.Record, error) {
	var queue, request []byte
	r, err := scanRecord(sc, nil, append([]any{&queue, &request}, trail...)...)
	if err != nil || request == nil {
		return r, err
	}
	r.Request, err = storekit.DecodeRequest(string(queue), request)
	return r, err
}

// runIn binds a and executes qq on tx, answering the rows it changed.
func runIn(ctx context.Context, tx *sql.Tx, qq *query, a args) (int64, error) {
	bound, err := qq.bind(a)
	if err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, qq.sql, bound...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// write stores r over the row read as prev (same fence and state), or as
// a new row when prev is nil. tenant is the tenant of a new record (a
// string); nil keeps the row's.
func writeRecord(ctx context.Context, tx *sql.Tx, r *store.Record, prev *store.Record, tenant any) error {
	a, err := recordArgs(r)
	if err != nil {
		return err
	}
	a["tenant"] = tenant
	qq := qPendingInsert
	if prev != nil {
		qq = qPendingWrite
		a["old_fence"], a["old_state"] = prev.Fence, string(prev.State)
	}
	n, err := runIn(ctx, tx, qq, a)
	if err == nil && n != 1 {
		// The row is locked by this transaction: a miss is a bug.
		err = fmt.Errorf("record %q/%q changed under its lock", r.Scope, r.Key)
	}
	return err
}

// inTx runs fn in a READ COMMITTED transaction, again after a deadlock or
// a concurrent insert of the same key (which the next run then sees).
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return s.retry(ctx, transient, func() (err error) {
		tx, err := s.q.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

// ReservePending implements [store.Queue]: the row is read under its lock
// (or found absent), storekit.ApplyPending decides, and the result is written
// in the same transaction. Under a tenant cap the transaction first locks
// the tenant's row of idem_tenants, as a capped Reserve does, and the
// tenant's active records are counted under that lock when the decision
// would make one more active.
func (s *Store) ReservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	var res store.ReserveResult
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		capArgs := s.reserveArgs(p.ReserveParams)
		if p.MaxActive > 0 {
			if err := lockTenant(ctx, tx, capArgs); err != nil {
				return err
			}
		}
		now, err := s.instant(ctx, tx)
		if err != nil {
			return err
		}
		a, err := qPendingLock.bind(s.idArgs(p.Scope, p.Key))
		if err != nil {
			return err
		}
		var prev *store.Record
		rec, err := scanPending(tx.QueryRowContext(ctx, qPendingLock.sql, a...))
		switch {
		case err == nil:
			prev = &rec
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		out, r, write, err := storekit.ApplyPending(prev, &p, now.Truncate(store.Resolution), func() (int, error) {
			n, _, err := checkTenant(ctx, tx, qTenantCheck, capArgs)
			return n, err
		})
		if err != nil {
			return err
		}
		res = store.ReserveResult{Outcome: out, Record: r}
		if !write {
			return nil
		}
		var tenant any // kept, unless the record is new
		if out == store.Created {
			tenant = p.Tenant
		}
		return writeRecord(ctx, tx, &r, prev, tenant)
	})
	switch {
	case errors.Is(err, store.ErrOverCap):
		return store.ReserveResult{}, err
	case err != nil:
		return store.ReserveResult{}, wrap("reserve pending", err)
	}
	return res, nil
}

// lockBatch selects a batch with sel under FOR UPDATE SKIP LOCKED, changes
// each record with f and writes it back.
func (s *Store) lockBatch(ctx context.Context, sel *query, a args, f func(r *store.Record, now time.Time)) ([]store.Record, error) {
	var out []store.Record
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		out = nil
		bound, err := sel.bind(a)
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, sel.sql, bound...)
		if err != nil {
			return err
		}
		var now dbTime
		if out, err = collect(rows, func(sc scanner) (store.Record, error) { return scanPending(sc, &now) }); err != nil {
			return err
		}
		for i := range out {
			prev := out[i]
			f(&out[i], now.t)
			if err := writeRecord(ctx, tx, &out[i], &prev, nil); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// Claim implements [store.Queue].
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	out, err := s.lockBatch(ctx, qClaimSelect, args{"now": s.nowArg(), "queue": []byte(p.Queue), "limit": p.Limit},
		func(r *store.Record, now time.Time) {
			r.State = store.StateInProgress
			r.Fence = storekit.NextFence(r.Fence, now)
			r.Attempts++
			r.LockedUntil = now.Add(storekit.RoundUp(p.Lease))
			r.UpdatedAt = now
		})
	return out, wrap("claim", err)
}

// ExpirePending implements [store.Queue].
func (s *Store) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	out, err := s.lockBatch(ctx, qExpireSelect, args{"now": s.nowArg(), "limit": p.Limit},
		func(r *store.Record, now time.Time) {
			resp := p.Response
			r.State = store.StateCompleted
			r.Response = &resp
			r.Request = nil
			r.LastError = store.ExpiredPendingError
			r.CompletedAt, r.UpdatedAt = now, now
			if p.TTL > 0 {
				r.ExpiresAt = now.Add(storekit.RoundUp(p.TTL))
			}
		})
	return out, wrap("expire pending", err)
}
