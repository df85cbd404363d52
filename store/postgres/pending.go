package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var _ store.Queue = (*Store)(nil)
var _ store.ActiveCounter = (*Store)(nil)

// Asynchronous acceptance: the pending record is the queue. Workers claim
// with SELECT ... FOR UPDATE SKIP LOCKED, so concurrent claimers on any
// number of instances split the pending rows and never take one twice,
// and the accepted request commits in the same single write as its record
// (no second table or job to keep consistent with it).

const pendingColumns = recordColumns + `, queue, request`

const pendingColumnsR = recordColumnsR + `, r.queue, r.request`

// fenceAt is storekit.NextFence's clock part for the instant "now".
const fenceAt = `greatest((extract(epoch FROM now) * 1000000)::bigint, 1)`

// sqlPendingInsert: $1 scope, $2 key, $3 fingerprint, $4 claim wait µs,
// $5 ttl µs, $6 lease policy, $7 now (nullable), $8 queue, $9 request,
// $10 tenant.
const sqlPendingInsert = `
WITH clock AS (SELECT coalesce($7::timestamptz, statement_timestamp()) AS now)
INSERT INTO {schema}idem_records AS r
	(scope, key, fingerprint, state, fence, lease_policy, locked_until,
	 attempts, created_at, updated_at, expires_at, reap_after, queue, pending_queue, request,
	 tenant, active_tenant)
SELECT $1, $2, $3, 'pending', ` + fenceAt + `, $6,
	now + $4::bigint * interval '1 microsecond', 0, now, now,
	now + $5::bigint * interval '1 microsecond', now + $5::bigint * interval '1 microsecond',
	$8, $8, $9, $10, CASE WHEN {cap} THEN $10 END
FROM clock{absent}
ON CONFLICT {conflict} DO NOTHING
RETURNING ` + pendingColumns

// sqlPendingLock reads and locks the existing row with the instant the
// decision is taken at. $1 scope, $2 key, $3 now (nullable).
const sqlPendingLock = `
SELECT ` + recordColumns + `, coalesce($3::timestamptz, statement_timestamp())
FROM {schema}idem_records WHERE scope = $1 AND key = $2
FOR UPDATE`

// sqlPendingPeek is sqlPendingLock without the lock: the answer of a
// duplicate (a retry, a replay) that changes nothing.
const sqlPendingPeek = `
SELECT ` + recordColumns + `, coalesce($3::timestamptz, statement_timestamp())
FROM {schema}idem_records WHERE scope = $1 AND key = $2`

// sqlPendingSet makes the locked row pending (a recreation, a reclaim or
// a requeue after a dead worker). $1 scope, $2 key, $3 now, $4 claim
// wait µs, $5 ttl µs or 0 to keep expires_at, $6 fingerprint,
// $7 lease policy, $8 queue, $9 request, $10 recreate, $11 tenant.
const sqlPendingSet = `
UPDATE {schema}idem_records AS r SET
	state = 'pending',
	fence = greatest(r.fence + 1, greatest((extract(epoch FROM $3::timestamptz) * 1000000)::bigint, 1)),
	locked_until = $3::timestamptz + $4::bigint * interval '1 microsecond',
	expires_at = CASE WHEN $5::bigint > 0 THEN $3::timestamptz + $5::bigint * interval '1 microsecond'
		ELSE r.expires_at END,
	reap_after = CASE WHEN $5::bigint > 0 THEN $3::timestamptz + $5::bigint * interval '1 microsecond'
		ELSE r.reap_after END,
	last_error = '',
	updated_at = $3::timestamptz,
	queue = $8,
	pending_queue = $8,
	active_tenant = CASE WHEN {cap} THEN CASE WHEN $10 THEN $11 ELSE r.tenant END END,
	request = $9,
	fingerprint = CASE WHEN $10 THEN $6 ELSE r.fingerprint END,
	tenant = CASE WHEN $10 THEN $11 ELSE r.tenant END,
	lease_policy = CASE WHEN $10 THEN $7 ELSE r.lease_policy END,
	recovery_point = CASE WHEN $10 THEN '' ELSE r.recovery_point END,
	response_status = NULL,
	response_headers = NULL,
	response_body = NULL,
	response_body_omitted = false,
	attempts = CASE WHEN $10 THEN 0 ELSE r.attempts END,
	created_at = CASE WHEN $10 THEN $3::timestamptz ELSE r.created_at END,
	completed_at = NULL,
	reconcile_after = NULL,
	reconcile_attempts = 0,
	dead_lettered_at = NULL,
	owner = NULL
WHERE scope = $1 AND key = $2
RETURNING ` + pendingColumns

// sqlPendingToUnknown: an expired lease under policy unknown, as Reserve
// does it. $1 scope, $2 key, $3 now.
const sqlPendingToUnknown = `
UPDATE {schema}idem_records SET
	state = 'unknown', last_error = 'lease_expired', pending_queue = NULL,
	reconcile_after = $3::timestamptz, updated_at = $3::timestamptz
WHERE scope = $1 AND key = $2
RETURNING ` + recordColumns

// sqlClaim: $1 queue, $2 now (nullable), $3 limit, $4 lease µs.
const sqlClaim = `
WITH clock AS (SELECT coalesce($2::timestamptz, statement_timestamp()) AS now),
picked AS (
	SELECT r.scope, r.key
	FROM {schema}idem_records r, clock c
	WHERE r.pending_queue = $1 AND r.locked_until > c.now AND r.state = 'pending'
	ORDER BY r.created_at
	LIMIT $3
	FOR UPDATE OF r SKIP LOCKED
)
UPDATE {schema}idem_records AS r SET
	state = 'in_progress',
	pending_queue = NULL,
	fence = greatest(r.fence + 1, greatest((extract(epoch FROM c.now) * 1000000)::bigint, 1)),
	attempts = r.attempts + 1,
	locked_until = c.now + $4::bigint * interval '1 microsecond',
	updated_at = c.now
FROM picked, clock c
WHERE r.scope = picked.scope AND r.key = picked.key AND r.state = 'pending'
RETURNING ` + pendingColumnsR

// sqlExpirePending: $1 now (nullable), $2 limit, $3 status, $4 headers,
// $5 body, $6 body omitted, $7 ttl µs or 0 to keep expires_at.
var sqlExpirePending = `
WITH clock AS (SELECT coalesce($1::timestamptz, statement_timestamp()) AS now),
due AS (
	SELECT r.scope, r.key
	FROM {schema}idem_records r, clock c
	WHERE r.pending_queue IS NOT NULL AND r.locked_until <= c.now AND r.state = 'pending'
	ORDER BY r.locked_until
	LIMIT $2
	FOR UPDATE OF r SKIP LOCKED
)
UPDATE {schema}idem_records AS r SET
	` + completing("$3", "$4", "$5", "$6", "'"+store.ExpiredPendingError+"'", "c.now", renewedExpiry("c.now", "$7::bigint"), newReapAfter) + `
FROM due, clock c
WHERE r.scope = due.scope AND r.key = due.key AND r.state = 'pending'
RETURNING ` + pendingColumnsR

type pendingQueries struct {
	insert, peek, lock, set, toUnknown, claim, expire string
}

// pendingSQL caches the statements per schema and Config.TenantCap (a
// Store's are fixed).
var pendingSQL sync.Map // pendingKey -> *pendingQueries

type pendingKey struct {
	schema                 string
	tenantCap, partitioned bool
}

func (s *Store) pq() *pendingQueries {
	k := pendingKey{s.cfg.Schema, s.cfg.TenantCap, s.cfg.Partitions > 0}
	if q, ok := pendingSQL.Load(k); ok {
		return q.(*pendingQueries)
	}
	r := placeholders(s.cfg.Schema, s.cfg.TenantCap, s.cfg.Partitions > 0)
	q := &pendingQueries{
		insert: r.Replace(sqlPendingInsert), peek: r.Replace(sqlPendingPeek), lock: r.Replace(sqlPendingLock), set: r.Replace(sqlPendingSet),
		toUnknown: r.Replace(sqlPendingToUnknown), claim: r.Replace(sqlClaim), expire: r.Replace(sqlExpirePending),
	}
	v, _ := pendingSQL.LoadOrStore(k, q)
	return v.(*pendingQueries)
}

// scanPending reads pendingColumns.
func scanPending(row pgx.Row, rec *store.Record, extra ...any) error {
	var (
		queue   *string
		request []byte
	)
	if err := scanRecord(extraScan{row, append([]any{&queue, &request}, extra...)}, rec, nil); err != nil {
		return err
	}
	rec.Request = nil
	if request != nil {
		var q string
		if queue != nil {
			q = *queue
		}
		r, err := storekit.DecodeRequest(q, request)
		if err != nil {
			return err
		}
		rec.Request = r
	}
	return nil
}

// extraScan appends destinations to a row's Scan.
type extraScan struct {
	row   pgx.Row
	extra []any
}

func (e extraScan) Scan(dest ...any) error { return e.row.Scan(append(dest, e.extra...)...) }

func collectPending(rows pgx.Rows) ([]store.Record, error) {
	return collectWith(rows, func(row pgx.Row, rec *store.Record) error { return scanPending(row, rec) })
}

// ReservePending implements store.Queue: the common case (a new key) is
// one INSERT; otherwise the row is locked and storekit.Decide applied to it
// inside one transaction. A duplicate that changes nothing (a retry of a
// pending or completed request) is answered from a plain read after the
// INSERT, without a lock.
//
// Under a tenant cap the INSERT is not tried first: the transaction takes
// the tenant's advisory lock, as a capped Reserve does, then locks the row
// (or finds none), decides, and counts the tenant's active records when
// the decision would make one more active (storekit.CheckCap);
// the count runs after the lock is held, so it sees what the lock's
// previous holder committed.
func (s *Store) ReservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	res, err := s.reservePending(ctx, p)
	return s.confirmed(ctx, res, err)
}

func (s *Store) reservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	req, err := storekit.EncodeRequest(&p.Request)
	if err != nil {
		return store.ReserveResult{}, err
	}
	q := s.pq()
	capped := p.MaxActive > 0
	if capped && !s.cfg.TenantCap {
		return store.ReserveResult{}, s.capUnsupported("reserve pending")
	}
	for run := 0; run < maxReserveRuns; run++ {
		if !capped {
			// A new key, the common case, is one autocommitted INSERT.
			var res store.ReserveResult
			args := []any{p.Scope, p.Key, p.Fingerprint, storekit.Micros(p.Lease),
				storekit.Micros(p.TTL), string(p.LeasePolicy), s.now(), p.Request.Queue, req, p.Tenant}
			err := s.acknowledged(ctx, s.pool, func(c querier) error {
				if s.partitioned() {
					// After the key's lock (partition.go).
					return s.lockedRow(ctx, c, nil, p.Scope, p.Key, q.insert, args,
						func(row pgx.Row) error { return scanPending(row, &res.Record) })
				}
				return scanPending(c.QueryRow(ctx, q.insert, args...), &res.Record)
			})
			if err == nil {
				res.Outcome = store.Created
				return res, nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return store.ReserveResult{}, wrap(ctx, "reserve pending", err)
			}
		}
		// A duplicate that changes nothing is answered from a plain read,
		// without locking the row (nor the tenant).
		var rec store.Record
		var now time.Time
		err = scanRecord(extraScan{s.pool.QueryRow(ctx, q.peek, p.Scope, p.Key, s.now()), []any{&now}}, &rec, nil)
		switch {
		case err == nil && storekit.Decide(&rec, &p.ReserveParams, now) == storekit.ActExisting:
			return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return store.ReserveResult{}, wrap(ctx, "reserve pending", err)
		}
		var res store.ReserveResult
		var gone bool
		err = s.inTx(ctx, func(tx pgx.Tx) (err error) {
			res, gone, err = s.pendingIn(ctx, tx, q, &p, req)
			return err
		})
		switch {
		case errors.Is(err, store.ErrOverCap):
			return store.ReserveResult{}, err
		case err != nil:
			return store.ReserveResult{}, wrap(ctx, "reserve pending", err)
		case !gone:
			return res, nil
		}
	}
	return store.ReserveResult{}, fmt.Errorf("idem/postgres: reserve pending: key %q kept changing under %d attempts", p.Key, maxReserveRuns)
}

// pendingIn is ReservePending's transaction: gone reports a race to run
// again (the row was deleted since the uncapped INSERT conflicted, or
// inserted since the capped transaction found none).
func (s *Store) pendingIn(ctx context.Context, tx pgx.Tx, q *pendingQueries, p *store.PendingParams, req []byte) (res store.ReserveResult, gone bool, err error) {
	capped := p.MaxActive > 0
	if capped {
		if _, err := tx.Exec(ctx, sqlTenantLock, p.Tenant); err != nil {
			return res, false, err
		}
	}
	if s.partitioned() {
		if err := s.lockKey(ctx, tx, p.Scope, p.Key); err != nil {
			return res, false, err
		}
	}
	var rec store.Record
	var now time.Time
	act := storekit.ActCreate
	err = scanRecord(extraScan{tx.QueryRow(ctx, q.lock, p.Scope, p.Key, s.now()), []any{&now}}, &rec, nil)
	absent := errors.Is(err, pgx.ErrNoRows)
	switch {
	case err == nil:
		act = storekit.Decide(&rec, &p.ReserveParams, now)
	case !errors.Is(err, pgx.ErrNoRows):
		return res, false, err
	case !capped:
		return res, true, nil // deleted since the insert conflicted: insert again
	}
	if err := storekit.CheckCap(&p.ReserveParams, act, func() (int, error) { return s.active(ctx, tx, p.Tenant) }); err != nil {
		return res, false, err
	}
	var ttl int64
	recreate := false
	switch act {
	case storekit.ActExisting:
		return store.ReserveResult{Outcome: store.Existing, Record: rec}, false, nil
	case storekit.ActLeaseExpired:
		res.Outcome = store.Existing
		return res, false, scanRecord(tx.QueryRow(ctx, q.toUnknown, p.Scope, p.Key, now), &res.Record, nil)
	case storekit.ActCreate:
		if absent { // capped: the INSERT, inside the tenant's lock
			res.Outcome = store.Created
			err := scanPending(tx.QueryRow(ctx, q.insert, p.Scope, p.Key, p.Fingerprint, storekit.Micros(p.Lease),
				storekit.Micros(p.TTL), string(p.LeasePolicy), s.now(), p.Request.Queue, req, p.Tenant), &res.Record)
			if errors.Is(err, pgx.ErrNoRows) {
				return res, true, nil // inserted meanwhile by an uncapped or other tenant's call
			}
			return res, false, err
		}
		res.Outcome, ttl, recreate = store.Created, storekit.Micros(p.TTL), true
	case storekit.ActReclaim:
		res.Outcome, ttl = store.Reclaimed, storekit.Micros(p.TTL)
	default:
		res.Outcome = store.TakenOver
	}
	return res, false, scanPending(tx.QueryRow(ctx, q.set, p.Scope, p.Key, now, storekit.Micros(p.Lease), ttl,
		p.Fingerprint, string(p.LeasePolicy), p.Request.Queue, req, recreate, p.Tenant), &res.Record)
}

// Claim implements store.Queue.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	out, err := s.queryIndexed(ctx, sqlNoSeqScan, s.pq().claim, []any{p.Queue, s.now(), p.Limit, storekit.Micros(p.Lease)}, collectPending)
	if err != nil {
		return nil, wrap(ctx, "claim", err)
	}
	storekit.SortRecords(out, storekit.ByCreated)
	return out, nil
}

// ExpirePending implements store.Queue.
func (s *Store) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	headers, err := encodeHeader(p.Response.Header)
	if err != nil {
		return nil, err
	}
	body := p.Response.Body
	if p.Response.BodyOmitted {
		body = nil
	}
	out, err := s.queryIndexed(ctx, sqlNoSeqScan, s.pq().expire, []any{s.now(), p.Limit, p.Response.Status, headers, body,
		p.Response.BodyOmitted, storekit.Micros(p.TTL)}, collectPending)
	if err != nil {
		return nil, wrap(ctx, "expire pending", err)
	}
	storekit.SortRecords(out, storekit.ByDeadline)
	return out, nil
}
