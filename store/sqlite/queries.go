package sqlite

// Every statement of the store lives in this file. Times are bound as unix
// microseconds computed in Go from the store's clock, so no statement reads
// SQLite's own clock. The WHERE clauses that select by state repeat the
// predicates of the partial indexes in migrations/001_records.sql verbatim:
// SQLite uses a partial index only when the query implies its WHERE clause.

// recordColumns is the column list scanRecord reads, in its order. The
// driver reads an empty BLOB as nil, so "response_body IS NULL" tells a nil
// body from an empty one.
const recordColumns = `scope, key, fingerprint, state, fence, lease_policy, locked_until,
	recovery_point, response_status, response_headers, response_body, response_body IS NULL,
	response_body_omitted, last_error, attempts, created_at, updated_at, completed_at, expires_at,
	reconcile_after, reconcile_attempts, dead_lettered_at, owner`

const qGet = `SELECT ` + recordColumns + ` FROM idem_records WHERE scope = ?1 AND key = ?2`

// qGetWithRequest is Get: qGet and the request an unknown record keeps
// (an operator settles it from that), none of a pending or in-progress
// one (the worker's, possibly large); other reads pay nothing for it, as
// a terminal record keeps none.
const qGetWithRequest = `SELECT ` + recordColumns + `,
	CASE WHEN state NOT IN ('pending', 'in_progress') THEN queue END,
	CASE WHEN state NOT IN ('pending', 'in_progress') THEN request END
FROM idem_records WHERE scope = ?1 AND key = ?2`

// qActive counts a tenant's active records (store.State.Active), through
// the partial index idem_records_active.
const qActive = `SELECT count(*) FROM idem_records
WHERE tenant = ?1 AND state NOT IN ('completed', 'failed_retryable', 'expired')`

// qCountActive counts the active records of every tenant, stopping at ?1
// (store.ActiveCounter).
const qCountActive = `SELECT count(*) FROM (SELECT 1 FROM idem_records
WHERE state NOT IN ('completed', 'failed_retryable', 'expired') LIMIT ?1)`

// qRecreate is what a reservation that replaces a record (a new key on an
// expired one) writes over it, whatever state it starts in: qCreate's and
// qPendingCreate's shared assignments. The owner is the new record's:
// qCreate's Reserve, or NULL for a pending record, which inserts none.
const qRecreate = `	fingerprint = excluded.fingerprint,
	tenant = excluded.tenant,
	owner = excluded.owner,
	fence = max(fence + 1, excluded.fence),
	lease_policy = excluded.lease_policy,
	locked_until = excluded.locked_until,
	recovery_point = '',
	response_status = NULL,
	response_headers = NULL,
	response_body = NULL,
	response_body_omitted = 0,
	last_error = '',
	created_at = excluded.created_at,
	updated_at = excluded.updated_at,
	completed_at = NULL,
	expires_at = excluded.expires_at,
	reconcile_after = NULL,
	reconcile_attempts = 0`

// qCreate inserts a fresh record, or recreates one that is soft-expired or
// terminal past its expiry (everything but the fence reset). Fences follow
// storekit.NextFence: now in microseconds, and above the row's fence. Any other
// existing record is left alone and no row is returned.
//
// ?1 scope, ?2 key, ?3 fingerprint, ?4 lease policy, ?5 locked_until,
// ?6 now, ?7 expires_at, ?8 tenant, ?9 owner.
const qCreate = `INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_policy,
	locked_until, attempts, created_at, updated_at, expires_at, tenant, owner)
VALUES (?1, ?2, ?3, 'in_progress', max(?6, 1), ?4, ?5, 1, ?6, ?6, ?7, ?8, ?9)
ON CONFLICT (scope, key) DO UPDATE SET
	state = 'in_progress',
	attempts = 1,
` + qRecreate + `
WHERE state = 'expired'
	OR (state IN ('completed', 'failed_retryable') AND expires_at <= excluded.created_at)
RETURNING ` + recordColumns

// qReclaim gives a failed_retryable record back to a retry with the same
// fingerprint, a new execution under the reclaiming Reserve's owner.
// ?1 scope, ?2 key, ?3 fingerprint, ?4 locked_until, ?5 now, ?6 expires_at,
// ?7 owner.
const qReclaim = `UPDATE idem_records SET
	state = 'in_progress',
	fence = max(fence + 1, ?5),
	owner = ?7,
	attempts = attempts + 1,
	locked_until = ?4,
	expires_at = ?6,
	last_error = '',
	reconcile_attempts = 0,
	updated_at = ?5
WHERE scope = ?1 AND key = ?2 AND state = 'failed_retryable' AND fingerprint = ?3
	AND expires_at > ?5
RETURNING ` + recordColumns

// qTakeOver hands an expired lease under policy retry or resume to a new
// holder, the owner of a new execution; recovery_point is kept for resume.
// ?1 scope, ?2 key, ?3 fingerprint, ?4 locked_until, ?5 now, ?6 owner.
const qTakeOver = `UPDATE idem_records SET
	fence = max(fence + 1, ?5),
	owner = ?6,
	attempts = attempts + 1,
	locked_until = ?4,
	reconcile_attempts = 0,
	updated_at = ?5
WHERE scope = ?1 AND key = ?2 AND state = 'in_progress' AND fingerprint = ?3
	AND lease_policy IN ('retry', 'resume') AND locked_until <= ?5
RETURNING ` + recordColumns

// qLeaseExpired moves one in_progress record whose lease expired under
// policy unknown to unknown, due for reconciliation now. ?1 scope, ?2 key,
// ?3 now.
const qLeaseExpired = `UPDATE idem_records SET
	state = 'unknown',
	reconcile_after = ?3,
	last_error = 'lease_expired',
	updated_at = ?3
WHERE scope = ?1 AND key = ?2 AND state = 'in_progress'
	AND lease_policy = 'unknown' AND locked_until <= ?3
RETURNING ` + recordColumns

// The lease holder's transitions: ?1 scope, ?2 key, ?3 fence, then their own
// parameters. Zero rows changed means the lease is lost.

// qSettle is what giving a record its outcome writes over it, whoever
// gives it (the lease holder, the expiry of a pending request, the reaper
// abandoning it, the settlement of an unknown one): the response (NULLs
// for failed_retryable), and no request kept for a worker. The shared
// assignments of qComplete, qExpirePending, qReapAbandon (through
// qCompleted) and qResolve; each adds its state, completed_at and
// last_error. ?1 now, ?3 status, ?4 headers, ?5 body, ?6 body omitted,
// ?7 new expires_at or NULL to keep it.
const qSettle = `	queue = NULL,
	request = NULL,
	response_status = ?3,
	response_headers = ?4,
	response_body = ?5,
	response_body_omitted = ?6,
	updated_at = ?1,
	expires_at = coalesce(?7, expires_at)`

// qCompleted is qSettle for a completed record.
const qCompleted = qSettle + `,
	state = 'completed',
	completed_at = ?1`

// qComplete numbers its parameters as qCompleted does, unlike the other
// transitions of the lease holder: ?1 now, ?2 fence, ?3 to ?7 as
// qCompleted, ?8 scope, ?9 key.
const qComplete = `UPDATE idem_records SET
` + qCompleted + `,
	last_error = ''
WHERE scope = ?8 AND key = ?9 AND state = 'in_progress' AND fence = ?2`

// qRelease: ?4 error, ?5 now.
const qRelease = `UPDATE idem_records SET
	queue = NULL,
	request = NULL,
	state = 'failed_retryable',
	last_error = ?4,
	updated_at = ?5
WHERE scope = ?1 AND key = ?2 AND state = 'in_progress' AND fence = ?3`

// qMarkUnknown: ?4 error, ?5 now, ?6 the request summary (NULL keeps
// the request the record holds).
const qMarkUnknown = `UPDATE idem_records SET
	state = 'unknown',
	last_error = ?4,
	reconcile_after = ?5,
	updated_at = ?5,
	request = coalesce(?6, request)
WHERE scope = ?1 AND key = ?2 AND state = 'in_progress' AND fence = ?3`

// qCheckpoint: ?4 recovery point, ?5 now.
const qCheckpoint = `UPDATE idem_records SET
	recovery_point = ?4,
	updated_at = ?5
WHERE scope = ?1 AND key = ?2 AND state = 'in_progress' AND fence = ?3`

// qExtend: ?4 locked_until, ?5 now.
const qExtend = `UPDATE idem_records SET
	locked_until = ?4,
	updated_at = ?5
WHERE scope = ?1 AND key = ?2 AND state = 'in_progress' AND fence = ?3`

// qDelete: ?3 the fence the record must still have, 0 for any.
const qDelete = `DELETE FROM idem_records
WHERE scope = ?1 AND key = ?2 AND state <> 'in_progress' AND (?3 = 0 OR fence = ?3)`

const qState = `SELECT state, fence FROM idem_records WHERE scope = ?1 AND key = ?2`

// qSweep moves up to ?2 expired leases under policy unknown to unknown.
// ?1 now, ?3 the latest lease end swept (now minus the sweeper's grace).
const qSweep = `UPDATE idem_records SET
	state = 'unknown',
	reconcile_after = ?1,
	last_error = 'lease_expired',
	updated_at = ?1
WHERE rowid IN (
	SELECT rowid FROM idem_records
	WHERE state = 'in_progress' AND lease_policy = 'unknown' AND locked_until <= ?3
	ORDER BY locked_until
	LIMIT ?2)
RETURNING ` + recordColumns

// qReapDue picks up to ?2 terminal records past expiry, the earliest
// first; ?1 now. qReapDelete's and qReapSoft's WHERE clause.
const qReapDue = `WHERE rowid IN (
	SELECT rowid FROM idem_records
	WHERE state IN ('completed', 'failed_retryable') AND expires_at <= ?1
	ORDER BY expires_at
	LIMIT ?2)`

// qReapDelete deletes the records of qReapDue.
const qReapDelete = `DELETE FROM idem_records
` + qReapDue

// qReapSoft is qReapDelete for soft mode: the records stay as expired.
const qReapSoft = `UPDATE idem_records SET
	state = 'expired',
	updated_at = ?1
` + qReapDue

// qReapAbandon completes up to ?2 unknown records past expiry, and
// in_progress ones past expiry whose lease ended by ?8 (now less the
// grace: a holder still renewing is alive), with the abandoned response.
// ?1 now, ?3 to ?6 the response and ?7 the new expires_at, as qCompleted.
const qReapAbandon = `UPDATE idem_records SET
` + qCompleted + `,
	last_error = 'abandoned',
	reconcile_after = NULL,
	dead_lettered_at = NULL
WHERE rowid IN (
	SELECT rowid FROM idem_records
	WHERE state IN ('in_progress', 'unknown') AND expires_at <= ?1
		AND (state = 'unknown' OR locked_until <= ?8)
	ORDER BY expires_at
	LIMIT ?2)`

// qListUnknownDue: ?1 now, ?2 limit.
const qListUnknownDue = `SELECT ` + recordColumns + ` FROM idem_records
WHERE state = 'unknown' AND reconcile_after <= ?1 AND dead_lettered_at IS NULL
ORDER BY reconcile_after
LIMIT ?2`

// qListUnknownAll: ?1 limit.
const qListUnknownAll = `SELECT ` + recordColumns + ` FROM idem_records
WHERE state = 'unknown'
ORDER BY reconcile_after
LIMIT ?1`

// qResolve settles an unknown record. ?1 now, ?2 the fence the
// settlement is about, ?3 to ?7 as qSettle (the response columns are
// NULL/0 for failed_retryable), ?8 scope, ?9 key, ?10 target state,
// ?11 completed_at or NULL. A completed record carries no last_error; a
// failed_retryable one keeps the reason it became unknown.
const qResolve = `UPDATE idem_records SET
` + qSettle + `,
	state = ?10,
	completed_at = ?11,
	last_error = CASE WHEN ?10 = 'completed' THEN '' ELSE last_error END,
	reconcile_after = NULL,
	dead_lettered_at = NULL
WHERE scope = ?8 AND key = ?9 AND state = 'unknown' AND fence = ?2`

// qDefer reschedules an unknown record's reconciliation, if the attempt
// is about its execution and not counted yet. ?3 reconcile_after,
// ?4 error, ?5 now, ?6 fence, ?7 the attempts the caller was shown.
const qDefer = `UPDATE idem_records SET
	reconcile_attempts = reconcile_attempts + 1,
	reconcile_after = ?3,
	last_error = ?4,
	updated_at = ?5
WHERE scope = ?1 AND key = ?2 AND state = 'unknown' AND fence = ?6 AND reconcile_attempts = ?7`

// qDeadLetter gives up on an unknown record, as qDefer. ?3 now,
// ?4 error, ?5 fence, ?6 the attempts the caller was shown.
const qDeadLetter = `UPDATE idem_records SET
	reconcile_attempts = reconcile_attempts + 1,
	dead_lettered_at = ?3,
	last_error = ?4,
	updated_at = ?3
WHERE scope = ?1 AND key = ?2 AND state = 'unknown' AND fence = ?5 AND reconcile_attempts = ?6`

// qPing reads the schema page, so it fails when the file cannot be read.
const qPing = `SELECT count(*) FROM sqlite_schema`

const qMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL
)`

const qMigrationsApplied = `SELECT version FROM idem_migrations`

const qMigrationInsert = `INSERT INTO idem_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)`
