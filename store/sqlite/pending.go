package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var _ store.Queue = (*Store)(nil)
var _ store.ActiveCounter = (*Store)(nil)

// Asynchronous acceptance: the pending record is the queue. SQLite has one
// writer, so a claim is one UPDATE of the oldest pending rows; no two
// claimers can take the same row.

const pendingColumns = recordColumns + `, queue, request`

// qPendingCreate inserts a pending record, or replaces one that Decide
// said may be recreated (the caller checked it inside the transaction).
// ?1 scope, ?2 key, ?3 fingerprint, ?4 lease policy, ?5 claim deadline,
// ?6 now, ?7 expires_at, ?8 queue, ?9 request, ?10 tenant.
const qPendingCreate = `INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_policy,
	locked_until, attempts, created_at, updated_at, expires_at, queue, request, tenant)
VALUES (?1, ?2, ?3, 'pending', max(?6, 1), ?4, ?5, 0, ?6, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (scope, key) DO UPDATE SET
	state = 'pending',
	attempts = 0,
	dead_lettered_at = NULL,
` + qRecreate + `,
	queue = excluded.queue,
	request = excluded.request
RETURNING ` + pendingColumns

// qPendingRequeue puts a failed_retryable record or an expired lease under
// policy retry or resume back in the queue, as a new execution that no
// Reserve started (owner NULL). ?1 scope, ?2 key, ?3 fence read, ?4 claim
// deadline, ?5 now, ?6 expires_at or NULL to keep it, ?7 queue, ?8 request.
const qPendingRequeue = `UPDATE idem_records SET
	state = 'pending',
	fence = max(fence + 1, ?5),
	locked_until = ?4,
	last_error = '',
	reconcile_attempts = 0,
	owner = NULL,
	updated_at = ?5,
	expires_at = coalesce(?6, expires_at),
	queue = ?7,
	request = ?8
WHERE scope = ?1 AND key = ?2 AND fence = ?3
RETURNING ` + pendingColumns

// qClaim: ?1 queue, ?2 now, ?3 limit, ?4 locked_until.
const qClaim = `UPDATE idem_records SET
	state = 'in_progress',
	fence = max(fence + 1, ?2),
	attempts = attempts + 1,
	locked_until = ?4,
	updated_at = ?2
WHERE rowid IN (
	SELECT rowid FROM idem_records
	WHERE state = 'pending' AND queue = ?1 AND locked_until > ?2
	ORDER BY created_at
	LIMIT ?3)
RETURNING ` + pendingColumns

// qExpirePending: ?1 now, ?2 limit, ?3 to ?7 the response and the new
// expires_at, as qCompleted.
const qExpirePending = `UPDATE idem_records SET
` + qCompleted + `,
	last_error = '` + store.ExpiredPendingError + `'
WHERE rowid IN (
	SELECT rowid FROM idem_records
	WHERE state = 'pending' AND locked_until <= ?1
	ORDER BY locked_until
	LIMIT ?2)
RETURNING ` + pendingColumns

// withRequest scans recordColumns followed by queue and request.
type withRequest struct {
	sc      scanner
	queue   sql.NullString
	request []byte
}

func (w *withRequest) Scan(dest ...any) error {
	return w.sc.Scan(append(dest, &w.queue, &w.request)...)
}

func scanPending(sc scanner) (store.Record, error) {
	w := &withRequest{sc: sc}
	r, err := scanRecord(w)
	if err != nil || w.request == nil {
		return r, err
	}
	r.Request, err = storekit.DecodeRequest(w.queue.String, w.request)
	return r, err
}

func queryPending(ctx context.Context, q querier, query string, args ...any) ([]store.Record, error) {
	return queryWith(ctx, q, scanPending, query, args...)
}

// ReservePending implements [store.Queue] in one immediate transaction,
// which makes the tenant cap's count and the write one step, as for
// Reserve.
func (s *Store) ReservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	req, err := storekit.EncodeRequest(&p.Request)
	if err != nil {
		return store.ReserveResult{}, err
	}
	var res store.ReserveResult
	err = s.write(ctx, true, func(ctx context.Context, q querier) error {
		now := s.now()
		deadline := after(now, p.Lease)
		rec, err := getRecord(ctx, q, p.Scope, p.Key)
		act := storekit.ActCreate
		switch {
		case err == nil:
			act = storekit.Decide(&rec, &p.ReserveParams, now)
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		if err := storekit.CheckCap(&p.ReserveParams, act, activeOf(ctx, q, p.Tenant)); err != nil {
			return err
		}
		var expires sql.NullInt64
		switch act {
		case storekit.ActExisting:
			res = store.ReserveResult{Outcome: store.Existing, Record: rec}
			return nil
		case storekit.ActLeaseExpired:
			rec, err = scanRecord(q.QueryRowContext(ctx, qLeaseExpired, p.Scope, p.Key, now.UnixMicro()))
			res = store.ReserveResult{Outcome: store.Existing, Record: rec}
			return err
		case storekit.ActCreate:
			rec, err = scanPending(q.QueryRowContext(ctx, qPendingCreate, p.Scope, p.Key, p.Fingerprint,
				string(p.LeasePolicy), deadline, now.UnixMicro(), after(now, p.TTL), p.Request.Queue, req, p.Tenant))
			res = store.ReserveResult{Outcome: store.Created, Record: rec}
			return err
		case storekit.ActReclaim:
			res.Outcome = store.Reclaimed
			expires = sql.NullInt64{Int64: after(now, p.TTL), Valid: true}
		default: // ActTakeOver
			res.Outcome = store.TakenOver
		}
		res.Record, err = scanPending(q.QueryRowContext(ctx, qPendingRequeue, p.Scope, p.Key, rec.Fence,
			deadline, now.UnixMicro(), expires, p.Request.Queue, req))
		return err
	})
	if err != nil {
		return store.ReserveResult{}, wrap("reserve pending", err)
	}
	return res, nil
}

// Claim implements [store.Queue].
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var out []store.Record
	err := s.write(ctx, false, func(ctx context.Context, q querier) error {
		now := s.now()
		var err error
		out, err = queryPending(ctx, q, qClaim, p.Queue, now.UnixMicro(), p.Limit, after(now, p.Lease))
		return err
	})
	if err != nil {
		return nil, wrap("claim", err)
	}
	storekit.SortRecords(out, storekit.ByCreated)
	return out, nil
}

// ExpirePending implements [store.Queue].
func (s *Store) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	resp, err := encodeResponse(&p.Response)
	if err != nil {
		return nil, err
	}
	var out []store.Record
	err = s.write(ctx, false, func(ctx context.Context, q querier) error {
		now := s.now()
		var err error
		out, err = queryPending(ctx, q, qExpirePending, now.UnixMicro(), p.Limit,
			resp.status, resp.headers, resp.body, resp.omitted, newExpiry(now, p.TTL))
		return err
	})
	if err != nil {
		return nil, wrap("expire pending", err)
	}
	storekit.SortRecords(out, storekit.ByDeadline)
	return out, nil
}
