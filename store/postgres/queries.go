package postgres

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// All SQL of the store lives in this file. Statements name the table as
// {schema}idem_records; newQueries replaces {schema} once, at construction,
// with the sanitized Config.Schema (or nothing, to follow search_path).
//
// Time: every statement that needs "now" takes it as a nullable parameter
// and uses coalesce($n::timestamptz, statement_timestamp()). NULL means the
// database clock; statement_timestamp() rather than now() so that the Tx
// forms, run late inside a long caller transaction, do not date leases from
// the transaction's start. Durations are passed as whole microseconds.

// recordColumns is the column list every statement returns, in the order
// scanRecord reads it.
const recordColumns = `scope, key, fingerprint, state, fence, lease_policy, locked_until,
	recovery_point, response_status, response_headers, response_body,
	response_body_omitted, last_error, attempts, created_at, updated_at,
	completed_at, expires_at, reconcile_after, reconcile_attempts, dead_lettered_at, owner`

// recordColumnsR is recordColumns qualified by the alias r, for statements
// that join other relations with the same column names.
const recordColumnsR = `r.scope, r.key, r.fingerprint, r.state, r.fence, r.lease_policy,
	r.locked_until, r.recovery_point, r.response_status, r.response_headers,
	r.response_body, r.response_body_omitted, r.last_error, r.attempts,
	r.created_at, r.updated_at, r.completed_at, r.expires_at, r.reconcile_after,
	r.reconcile_attempts, r.dead_lettered_at, r.owner`

// sqlReserve is Reserve in one statement (one round trip).
//
//   - cur reads the existing row from the statement's snapshot and decides
//     what Reserve must do with it (action).
//   - ins inserts when cur saw no row. ON CONFLICT DO NOTHING covers a row
//     committed after the snapshot: it neither writes nor locks, and the
//     insert is not even attempted when cur saw the row (a replay costs an
//     index probe, not a speculative insertion).
//   - clock.new_fence is the fence of storekit.NextFence for a new row: the
//     statement's instant in microseconds (upd raises it above the row's).
//   - upd performs that action when it needs a write. Its guard is checked
//     again on the latest row version (READ COMMITTED re-evaluates the WHERE
//     of an UPDATE after waiting for a concurrent writer), and it requires
//     state and fence to be unchanged since the snapshot, so the action
//     computed from cur still applies to the row it writes. The
//     uncorrelated EXISTS on cur becomes a one-time filter, so a replay
//     does not even scan the table a second time.
//
// The final SELECT returns exactly one row, or none:
//   - 'created' from ins; the action from upd; 'existing' from cur when no
//     write was needed;
//   - 'stale' when cur wanted a write but upd lost a race against a
//     concurrent transition (the snapshot is out of date);
//   - no row when the insert conflicted with a row committed after the
//     statement's snapshot was taken: the conflict stops the insert, but
//     cur and upd cannot see that row.
//
// The last two only happen under a true race on one key; Reserve then runs
// the statement again with a fresh snapshot.
//
// $1 scope, $2 key, $3 fingerprint, $4 lease and $5 TTL in microseconds,
// $6 lease policy, $7 now (NULL: the database clock), $8 tenant, $9 owner
// (stored by the moves that start an execution: all but 'to_unknown').
var sqlReserve = `
WITH clock AS (
	SELECT now, greatest((extract(epoch FROM now) * 1000000)::bigint, 1) AS new_fence
	FROM (SELECT coalesce($7::timestamptz, statement_timestamp()) AS now) t
),
cur AS (
	SELECT ` + recordColumns + `,
		` + reserveActionSingle + ` AS action
	FROM {schema}idem_records r, clock c
	WHERE r.scope = $1 AND r.key = $2
),
ins AS (
	INSERT INTO {schema}idem_records AS r
		(scope, key, fingerprint, state, fence, lease_policy, locked_until,
		 attempts, created_at, updated_at, expires_at, reap_after, tenant, active_tenant, owner)
	SELECT $1, $2, $3, 'in_progress', c.new_fence, $6,
		c.now + $4::bigint * interval '1 microsecond',
		1, c.now, c.now, c.now + $5::bigint * interval '1 microsecond',
		c.now + $5::bigint * interval '1 microsecond', $8, CASE WHEN {cap} THEN $8 END, $9::bigint
	FROM clock c
	WHERE NOT EXISTS (SELECT FROM cur)
	ON CONFLICT {conflict} DO NOTHING
	RETURNING ` + recordColumns + `
),
upd AS (
	UPDATE {schema}idem_records AS r SET
		state = CASE WHEN cur.action = 'to_unknown' THEN 'unknown' ELSE 'in_progress' END,
		fingerprint = CASE WHEN cur.action = 'replace' THEN $3 ELSE r.fingerprint END,
		tenant = CASE WHEN cur.action = 'replace' THEN $8 ELSE r.tenant END,
		active_tenant = CASE WHEN NOT {cap} THEN NULL
			WHEN cur.action = 'replace' THEN $8 ELSE r.tenant END,
		fence = CASE WHEN cur.action = 'to_unknown' THEN r.fence
			ELSE greatest(r.fence + 1, c.new_fence) END,
		owner = CASE WHEN cur.action = 'to_unknown' THEN r.owner ELSE $9::bigint END,
		lease_policy = CASE WHEN cur.action = 'replace' THEN $6 ELSE r.lease_policy END,
		locked_until = CASE WHEN cur.action = 'to_unknown' THEN r.locked_until
			ELSE c.now + $4::bigint * interval '1 microsecond' END,
		recovery_point = CASE WHEN cur.action = 'replace' THEN '' ELSE r.recovery_point END,
		response_status = NULL,
		response_headers = NULL,
		response_body = NULL,
		response_body_omitted = false,
		last_error = CASE WHEN cur.action = 'to_unknown' THEN 'lease_expired' ELSE '' END,
		attempts = CASE cur.action WHEN 'replace' THEN 1 WHEN 'to_unknown' THEN r.attempts
			ELSE r.attempts + 1 END,
		created_at = CASE WHEN cur.action = 'replace' THEN c.now ELSE r.created_at END,
		updated_at = c.now,
		completed_at = NULL,
		expires_at = CASE WHEN cur.action IN ('replace', 'reclaim')
			THEN c.now + $5::bigint * interval '1 microsecond' ELSE r.expires_at END,
		reap_after = CASE WHEN cur.action IN ('replace', 'reclaim')
			THEN c.now + $5::bigint * interval '1 microsecond' ELSE r.reap_after END,
		reconcile_after = CASE WHEN cur.action = 'to_unknown' THEN c.now END,
		reconcile_attempts = CASE WHEN cur.action = 'to_unknown' THEN r.reconcile_attempts ELSE 0 END
	FROM cur, clock c
	WHERE r.scope = $1 AND r.key = $2
		AND cur.action <> 'none'
		AND EXISTS (SELECT FROM cur WHERE cur.action <> 'none')
		AND NOT EXISTS (SELECT FROM ins)
		AND r.state = cur.state AND r.fence = cur.fence
		AND (cur.action NOT IN ('takeover', 'to_unknown') OR r.locked_until <= c.now)
	RETURNING cur.action, ` + recordColumnsR + `
)
SELECT 'created', ` + recordColumns + ` FROM ins
UNION ALL
SELECT action, ` + recordColumns + ` FROM upd
UNION ALL
SELECT CASE WHEN action = 'none' THEN 'existing' ELSE 'stale' END, ` + recordColumns + `
FROM cur
WHERE NOT EXISTS (SELECT FROM ins) AND NOT EXISTS (SELECT FROM upd)`

// reserveAction is the rule of Reserve for a record r that exists: what it
// does to it, given the request's fingerprint ({fingerprint}) and the
// instant ({now}).
//   - 'replace': the record is expired (soft, or terminal and past its
//     expiry): the key starts over as new;
//   - 'reclaim': released (failed_retryable): the same request runs again;
//   - 'takeover' or 'to_unknown': in progress with its lease run out: the
//     record's lease policy decides;
//   - 'none': the record stands as it is (answered, in flight, unknown, or
//     another request's).
//
// sqlReserve performs the action; sqlReserveMany settles only 'none' and
// sends every other action to sqlReserve, so the rule is written once.
const reserveAction = `CASE
			WHEN r.state = 'expired'
				OR (r.state IN ('completed', 'failed_retryable') AND r.expires_at <= {now})
				THEN 'replace'
			WHEN r.fingerprint <> {fingerprint} THEN 'none'
			WHEN r.state = 'failed_retryable' THEN 'reclaim'
			WHEN r.state = 'in_progress' AND r.locked_until <= {now} THEN
				CASE WHEN r.lease_policy = 'unknown' THEN 'to_unknown' ELSE 'takeover' END
			ELSE 'none'
		END`

// reserveActionSingle and reserveActionMany are reserveAction in
// sqlReserve (the clock CTE, parameter $3) and in sqlReserveMany (the
// input row's columns).
var (
	reserveActionSingle = strings.NewReplacer("{now}", "c.now", "{fingerprint}", "$3").Replace(reserveAction)
	reserveActionMany   = strings.NewReplacer("{now}", "r.in_now", "{fingerprint}", "r.in_fingerprint").Replace(reserveAction)
)

// The lease-holder transitions: one UPDATE each, guarded by state and
// fence. Zero rows affected means the lease was lost.
// $1 scope, $2 key, $3 fence, $4 now (nullable), then the operation's own.

var sqlComplete = `
UPDATE {schema}idem_records AS r SET
	` + completing("$5", "$6", "$7", "$8", "''", "coalesce($4::timestamptz, statement_timestamp())",
	renewedExpiry("coalesce($4::timestamptz, statement_timestamp())", "$9::bigint"), keptReapAfter) + `
WHERE key = $2 AND scope = $1 AND state = 'in_progress' AND fence = $3`

// completing is the SET list that completes a record with an answer, in
// every statement that does (Complete, its multi-row form, the reaper's
// abandoned records, expired pending requests); its arguments are the
// statement's own expressions for the answer's status, headers (JSON
// text), body and body-omitted flag, last_error, the instant, the new
// expiry and the new reap_after (an expression of {expires}).
//
// A completion by the lease holder must change no indexed column, so that
// PostgreSQL writes it as a heap-only tuple (migration 008): active_tenant
// and pending_queue are already NULL there (on a store without
// Config.TenantCap), and reap_after stays (keptReapAfter).
func completing(status, headers, body, omitted, lastError, now, expires, reapAfter string) string {
	return `state = 'completed',
	` + clearRequest + `,
	response_status = ` + status + `,
	response_headers = ` + headers + `::text::jsonb,
	response_body = ` + body + `,
	response_body_omitted = ` + omitted + `,
	last_error = ` + lastError + `,
	completed_at = ` + now + `,
	updated_at = ` + now + `,
	active_tenant = NULL,
	pending_queue = NULL,
	expires_at = ` + expires + `,
	reap_after = ` + strings.ReplaceAll(reapAfter, "{expires}", expires)
}

// keptReapAfter keeps reap_after where the reservation put it unless the
// new expiry comes earlier (a shorter TTL at completion than at
// reservation): it stays a lower bound of expires_at, so that the reaper
// finds the record, and a completion within the retention leaves it as it
// was.
const keptReapAfter = `least(r.reap_after, {expires})`

// newReapAfter is reap_after of a statement that may write index entries
// anyway (maintenance, settlements): the new expiry itself.
const newReapAfter = `{expires}`

// clearRequest drops the request kept for a worker (store.Record.Request)
// in every statement that ends a record in a terminal state: its headers
// may name the caller.
const clearRequest = `queue = NULL, request = NULL`

// renewedExpiry is a completion's expiry: now + ttl microseconds, or the
// record's own expiry when ttl is not positive.
func renewedExpiry(now, ttl string) string {
	return `CASE WHEN ` + ttl + ` > 0 THEN ` + now + ` + ` + ttl + ` * interval '1 microsecond' ELSE r.expires_at END`
}

var sqlRelease = `
UPDATE {schema}idem_records SET
	state = 'failed_retryable',
	active_tenant = NULL,
	` + clearRequest + `,
	last_error = $5,
	updated_at = coalesce($4::timestamptz, statement_timestamp())
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND fence = $3`

// sqlMarkUnknown: $6 the request summary (NULL keeps the request the
// record holds).
const sqlMarkUnknown = `
UPDATE {schema}idem_records SET
	state = 'unknown',
	last_error = $5,
	reconcile_after = coalesce($4::timestamptz, statement_timestamp()),
	updated_at = coalesce($4::timestamptz, statement_timestamp()),
	request = coalesce($6::bytea, request)
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND fence = $3`

const sqlCheckpoint = `
UPDATE {schema}idem_records SET
	recovery_point = $5,
	updated_at = coalesce($4::timestamptz, statement_timestamp())
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND fence = $3`

const sqlExtend = `
UPDATE {schema}idem_records SET
	locked_until = coalesce($4::timestamptz, statement_timestamp()) + $5::bigint * interval '1 microsecond',
	updated_at = coalesce($4::timestamptz, statement_timestamp())
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND fence = $3`

// sqlBatchLockTimeout opens every batch: lock_timeout for the rest of the
// batch's implicit transaction only. $1 the timeout.
//
// It also turns sequential scans off for that transaction. The multi-row
// Complete joins its input to the table, and its generic plan lives as
// long as the connection: planned on an almost empty table (a service's
// first requests), a sequential scan looks cheaper than a probe of the
// primary key per input row, and would stay once the table holds
// millions of rows. No statement of a batch wants a sequential scan
// (nor JIT, see noSeqScanSettings).
const sqlBatchLockTimeout = `SELECT set_config('lock_timeout', $1, true), ` + noSeqScanSettings

// sqlGet reads the request an unknown record keeps (an operator settles
// it from that), and none of a pending or in-progress one (the worker's,
// possibly large): other records pay nothing for it, as a terminal record
// keeps none (clearRequest).
const sqlGet = `
SELECT ` + recordColumns + `,
	CASE WHEN state NOT IN ('pending', 'in_progress') THEN queue END,
	CASE WHEN state NOT IN ('pending', 'in_progress') THEN request END
FROM {schema}idem_records
WHERE scope = $1 AND key = $2`

// sqlDelete deletes a record not in progress whose fence is $3 (0: any)
// and, like onUnknown, reports whether it did and the record's state and
// fence from the statement's snapshot, so that a miss is told apart in the
// same round trip.
const sqlDelete = `
WITH del AS (
	DELETE FROM {schema}idem_records
	WHERE scope = $1 AND key = $2 AND state <> 'in_progress'
		AND ($3::bigint = 0 OR fence = $3::bigint)
	RETURNING 1
)
SELECT EXISTS (SELECT FROM del),
	(SELECT state FROM {schema}idem_records WHERE scope = $1 AND key = $2),
	(SELECT fence FROM {schema}idem_records WHERE scope = $1 AND key = $2)`

// sqlSweep walks the leases that ended since the sweep mark
// (idem_sweep_mark.swept_to) in the order they ended, through
// idem_records_locked_idx, and moves the in_progress ones under policy
// unknown to unknown. A completed record keeps the end of its last lease
// (a completion writes no index entry): it is walked once, when the mark
// passes it, and never again. The mark only moves forward, to where the
// walk stopped; the walk starts at the mark itself (>=), so that records
// sharing the mark's instant are walked again rather than skipped.
//
// The sweep runs after sqlSweepLock, in the same transaction: a second
// sweeper waits for the first to commit, then walks from where it left
// the mark, in a snapshot that sees what it swept. A lease is missed only
// if its record commits after the mark has passed its end (a ReserveTx
// whose transaction outlives its lease and grace); a retry's Reserve
// (same fingerprint) turns it unknown (reserveAction's 'to_unknown'), and
// the reaper closes it once past its expiry (sqlReapAbandon).
//
// The sweep waits for no row lock: it would hold the mark, and so stop
// every sweeper, for as long as the lock's holder (a caller's transaction
// that ran CompleteTx or CheckpointTx, possibly long past the lease) keeps
// its transaction open. locked takes the due rows with SKIP LOCKED, the
// first $1 it can lock in the order the leases ended (a skipped row does
// not use up the limit, so a full batch still tells the caller to sweep
// again), and only those: a lock on every walked row, mostly completed
// ones, would dirty their heap pages at every pass. FOR NO KEY UPDATE is
// the lock swept's UPDATE takes anyway.
//
// locked reads each due row through a LATERAL subquery with LIMIT 1, over
// the due rows already in order (so the outer LIMIT stops the locking),
// and swept finds its rows through the arrays of their keys and scopes:
// both can only probe the primary key. Joined to the table instead, they
// would be planned, in the generic plan a connection keeps from a fresh,
// empty table, as a hash join over every lease that ever ended before the
// cutoff.
//
// A due row that locked skips (held by another transaction, or changed
// since the snapshot) holds the mark at its lease's end, so the next
// sweep looks at it again: it sweeps it if the holder's transaction
// rolled back, and walks past it if it completed. The mark passes a
// skipped row only when the walk stops at its bound: otherwise a
// transaction left open would pin the walk to the same first leases and
// no later lease would be swept; such a row is then the missed lease
// above, left to a retry's Reserve and the reaper.
//
// $1 limit, $2 now, $3 grace in microseconds, $4 the most leases walked.
const sqlSweep = `
WITH clock AS (
	SELECT now, now - $3::bigint * interval '1 microsecond' AS cutoff
	FROM (SELECT coalesce($2::timestamptz, statement_timestamp()) AS now) t
),
mark AS (
	SELECT swept_to FROM {schema}idem_sweep_mark
),
walked AS (
	SELECT r.scope, r.key, r.fence, r.locked_until,
		r.state = 'in_progress' AND r.lease_policy = 'unknown' AS due
	FROM {schema}idem_records r
	WHERE r.locked_until >= (SELECT swept_to FROM mark) AND r.locked_until <= (SELECT cutoff FROM clock)
	ORDER BY r.locked_until
	LIMIT $4
),
locked AS (
	SELECT r.scope, r.key, r.fence, w.locked_until
	FROM (SELECT * FROM walked WHERE due ORDER BY locked_until) w, clock c,
	LATERAL (
		SELECT x.scope, x.key, x.fence FROM {schema}idem_records x
		WHERE x.key = w.key AND x.scope = w.scope AND x.state = 'in_progress'
			AND x.fence = w.fence AND x.locked_until <= c.cutoff
		LIMIT 1
		FOR NO KEY UPDATE SKIP LOCKED
	) r
	ORDER BY w.locked_until
	LIMIT $1
),
swept AS (
	UPDATE {schema}idem_records AS r SET
		state = 'unknown',
		last_error = 'lease_expired',
		reconcile_after = c.now,
		updated_at = c.now
	FROM locked l, clock c
	WHERE r.key = ANY ((SELECT array_agg(k.key) FROM locked k)::text[])
		AND r.scope = ANY ((SELECT array_agg(k.scope) FROM locked k)::text[])
		AND r.key = l.key AND r.scope = l.scope AND r.state = 'in_progress' AND r.fence = l.fence
	RETURNING ` + recordColumnsR + `
),
unswept AS (
	SELECT w.locked_until FROM walked w
	WHERE w.due AND NOT EXISTS (SELECT FROM locked l WHERE l.key = w.key AND l.scope = w.scope)
),
moved AS (
	UPDATE {schema}idem_sweep_mark AS m SET swept_to = greatest(m.swept_to,
		CASE WHEN (SELECT count(*) FROM walked) < $4 THEN coalesce(
			-- the first due lease not swept: skipped, or past the limit
			(SELECT min(u.locked_until) FROM unswept u),
			(SELECT cutoff FROM clock))
		ELSE coalesce(
			-- the walk stopped at its bound: the first due lease past the
			-- limit, else the walk's end
			(SELECT min(u.locked_until) FROM unswept u
				WHERE u.locked_until >= (SELECT max(l.locked_until) FROM locked l HAVING count(*) >= $1)),
			(SELECT max(w.locked_until) FROM walked w))
		END)
	FROM mark
	RETURNING 1
)
SELECT ` + recordColumns + ` FROM swept`

// sqlSweepLock takes the sweep mark until the end of the transaction, and
// turns sequential scans and JIT off as sqlNoSeqScan does: the sweep reads
// idem_sweep_mark whole, a disabled scan that would make the server
// compile it at every pass while it holds the mark.
const sqlSweepLock = `SELECT ` + noSeqScanSettings + ` FROM {schema}idem_sweep_mark FOR UPDATE`

// sweepWalk bounds the leases one sweep walks; records sharing one lease
// end (a batch's reservations) must be fewer, or the mark would not pass
// them.
const sweepWalk = 10000

// The reaper statements each touch at most $1 rows and skip rows another
// reaper (or a live request) holds. $1 limit, $2 now.

// reapTerminalBatch locks up to $1 terminal records past expiry, oldest
// first, for the two terminal reap statements.
const reapTerminalBatch = `
WITH clock AS (
	SELECT coalesce($2::timestamptz, statement_timestamp()) AS now
),
batch AS (
	SELECT r.scope, r.key
	FROM {schema}idem_records r, clock c
	WHERE r.reap_after <= c.now AND r.expires_at <= c.now
		AND r.state IN ('completed', 'failed_retryable')
	ORDER BY r.reap_after
	LIMIT $1
	FOR UPDATE OF r SKIP LOCKED
)
`

const sqlReapDelete = reapTerminalBatch + `
DELETE FROM {schema}idem_records AS r
USING batch
WHERE r.scope = batch.scope AND r.key = batch.key`

// sqlReapSoft keeps the row as expired for audit but drops the stored
// response: it will never be replayed again.
const sqlReapSoft = reapTerminalBatch + `
UPDATE {schema}idem_records AS r SET
	state = 'expired',
	response_status = NULL,
	response_headers = NULL,
	response_body = NULL,
	response_body_omitted = false,
	reap_after = 'infinity',
	updated_at = c.now
FROM batch, clock c
WHERE r.scope = batch.scope AND r.key = batch.key`

// sqlReapAbandon turns in_progress and unknown records past expires_at into
// completed records with the operator's response. An in_progress record
// whose holder still renews its lease is not abandoned: its holder is alive,
// and so may be one whose lease ended less than the grace ago.
// $1 limit, $2 now, $3 status, $4 headers, $5 body, $6 body omitted, $7 ttl,
// $8 grace (microseconds).
var sqlReapAbandon = `
WITH clock AS (
	SELECT coalesce($2::timestamptz, statement_timestamp()) AS now
),
batch AS (
	SELECT r.scope, r.key
	FROM {schema}idem_records r, clock c
	WHERE r.reap_after <= c.now AND r.expires_at <= c.now
		AND (r.state = 'unknown' OR (r.state = 'in_progress'
			AND r.locked_until <= c.now - $8::bigint * interval '1 microsecond'))
	ORDER BY r.reap_after
	LIMIT $1
	FOR UPDATE OF r SKIP LOCKED
)
UPDATE {schema}idem_records AS r SET
	` + completing("$3", "$4", "$5", "$6", "'abandoned'", "c.now", "c.now + $7::bigint * interval '1 microsecond'", newReapAfter) + `,
	reconcile_after = NULL,
	dead_lettered_at = NULL
FROM batch, clock c
WHERE r.scope = batch.scope AND r.key = batch.key`

// $1 due only, $2 limit, $3 now.
const sqlListUnknown = `
SELECT ` + recordColumns + `
FROM {schema}idem_records
WHERE reconcile_after IS NOT NULL AND state = 'unknown'
	AND (NOT $1::boolean OR (reconcile_after <= coalesce($3::timestamptz, statement_timestamp())
		AND dead_lettered_at IS NULL))
ORDER BY reconcile_after, scope, key
LIMIT $2`

// sqlResolve, sqlDefer and sqlDeadLetter are guarded by the record's
// fence too (sqlResolve $10, sqlDefer $6, sqlDeadLetter $5), and the last
// two by the attempts their caller was shown (sqlDefer $7, sqlDeadLetter
// $6): see onUnknown for how a miss is told apart.
// $1 scope, $2 key, $3 now, then the operation's own.
//
// sqlResolve with a TTL ($9) sets expires_at and reap_after to now + TTL;
// without one it keeps both. reap_after then stays what it was: on the
// plain table a lower bound of the unchanged expires_at, so the reaper,
// which also requires expires_at past, finds the record when it expires
// and not before; on a partitioned table the row stays in its partition
// (reap_after past expires_at there, where the reaper moved a live record
// out of a retired partition, would otherwise send it back to an old
// range, the DEFAULT partition). TestResolveReapAfter pins both.
var sqlResolve = onUnknown(`state = $4,
		`+clearRequest+`,
		response_status = $5,
		response_headers = $6::text::jsonb,
		response_body = $7,
		response_body_omitted = $8,
		last_error = CASE WHEN $4 = 'completed' THEN '' ELSE last_error END,
		completed_at = CASE WHEN $4 = 'completed'
			THEN coalesce($3::timestamptz, statement_timestamp()) END,
		updated_at = coalesce($3::timestamptz, statement_timestamp()),
		expires_at = CASE WHEN $9::bigint > 0
			THEN coalesce($3::timestamptz, statement_timestamp()) + $9::bigint * interval '1 microsecond'
			ELSE expires_at END,
		reap_after = CASE WHEN $9::bigint > 0
			THEN coalesce($3::timestamptz, statement_timestamp()) + $9::bigint * interval '1 microsecond'
			ELSE reap_after END,
		active_tenant = NULL,
		reconcile_after = NULL,
		dead_lettered_at = NULL`, ` AND fence = $10::bigint`)

var sqlDefer = onUnknown(`reconcile_attempts = reconcile_attempts + 1,
		reconcile_after = coalesce($3::timestamptz, statement_timestamp()) + $4::bigint * interval '1 microsecond',
		last_error = $5,
		updated_at = coalesce($3::timestamptz, statement_timestamp())`,
	` AND fence = $6::bigint AND reconcile_attempts = $7::integer`)

var sqlDeadLetter = onUnknown(`reconcile_attempts = reconcile_attempts + 1,
		dead_lettered_at = coalesce($3::timestamptz, statement_timestamp()),
		last_error = $4,
		updated_at = coalesce($3::timestamptz, statement_timestamp())`,
	` AND fence = $5::bigint AND reconcile_attempts = $6::integer`)

// onUnknown is an UPDATE of an unknown record (the SET list set, and the
// further conditions where) that also reports, from the statement's
// snapshot, the record's state and fence: so that a miss can be told
// apart (absent: ErrNotFound; not unknown: ErrStateConflict; another
// execution's: ErrLeaseLost) in the same round trip. It returns whether
// the update matched, the state and the fence. $1 scope, $2 key, $3 now,
// then the operation's own.
func onUnknown(set, where string) string {
	return `
WITH upd AS (
	UPDATE {schema}idem_records SET
		` + set + `
	WHERE scope = $1 AND key = $2 AND state = 'unknown'` + where + `
	RETURNING 1
)
SELECT EXISTS (SELECT FROM upd),
	(SELECT state FROM {schema}idem_records WHERE scope = $1 AND key = $2),
	(SELECT fence FROM {schema}idem_records WHERE scope = $1 AND key = $2)`
}

// The replay cache (replaycache.go). Its channel is named after the
// schema (a hash: a channel name is shorter than a schema's may be); the
// notifier and the listeners compute it alike. $1 Config.Schema.
var sqlCacheChannel = `SELECT ` + cacheChannel("$1")

// cacheChannel is the channel's name, from Config.Schema given as the
// parameter schema.
func cacheChannel(schema string) string {
	return `'idem_cache_' || substr(md5(coalesce(nullif(` + schema + `::text, ''), current_schema())), 1, 16)`
}

// sqlCacheLock orders the invalidations of a schema: taken by each
// notification's transaction before it numbers the invalidation, and by a
// registration before it reads the last number, and held until commit, so
// that numbers commit (and notifications reach the caches) in their order,
// and no number below the one a registration reads is still uncommitted.
// A cache that applied number v has then applied every invalidation
// committed since it listened up to v. The key is the sequence's: one
// lock per schema.
const sqlCacheLock = `SELECT pg_advisory_xact_lock(hashtextextended('idem.cache.' || '{schema}idem_cache_seq'::regclass::oid::text, 0))`

// sqlCacheRegister registers a cache (removing those gone for an hour),
// under sqlCacheLock: seen is the last invalidation numbered and committed
// so far. $1 node, $2 lease µs.
const sqlCacheRegister = `
WITH gone AS (
	DELETE FROM {schema}idem_cache_nodes WHERE alive_until < statement_timestamp() - interval '1 hour'
)
INSERT INTO {schema}idem_cache_nodes (node, seen, alive_until)
SELECT $1, CASE WHEN is_called THEN last_value ELSE 0 END,
	statement_timestamp() + $2::bigint * interval '1 microsecond'
FROM {schema}idem_cache_seq
ON CONFLICT (node) DO UPDATE SET seen = EXCLUDED.seen, alive_until = EXCLUDED.alive_until
RETURNING statement_timestamp()`

// sqlCacheRenew: $1 node, $2 the last invalidation applied, $3 lease µs.
// No row: the registration is gone. The database's clock comes back for
// the cache's expiry checks.
const sqlCacheRenew = `
UPDATE {schema}idem_cache_nodes SET seen = greatest(seen, $2),
	alive_until = statement_timestamp() + $3::bigint * interval '1 microsecond'
WHERE node = $1
RETURNING statement_timestamp()`

const sqlCacheLeave = `DELETE FROM {schema}idem_cache_nodes WHERE node = $1`

// sqlCacheNotify numbers an invalidation of (scope $1, key $2) and
// notifies it, in a transaction of its own that starts after the change
// committed and holds sqlCacheLock: a cache that applied a number at
// least this one's has applied this notification. It also counts the
// caches alive (none has applied a number not yet given), so that a
// schema without any costs little more. $3 Config.Schema; $4 the bytes
// of the scope in UTF-8, as the listener receives it: in a database of
// another encoding octet_length would count the server's bytes.
var sqlCacheNotify = `
SELECT n.v, (SELECT count(*) FROM {schema}idem_cache_nodes
	WHERE seen < n.v AND alive_until > statement_timestamp())
FROM (SELECT nextval('{schema}idem_cache_seq') AS v) n
CROSS JOIN LATERAL pg_notify(` + cacheChannel("$3") + `,
	n.v::text || ' ' || $4::int || ' ' || $1::text || $2::text)`

// sqlCacheBehind counts the caches alive that have not applied
// invalidation $1.
const sqlCacheBehind = `
SELECT count(*) FROM {schema}idem_cache_nodes WHERE seen < $1 AND alive_until > statement_timestamp()`

// Migrations. The runner sets search_path to Config.Schema (when given) for
// its own transaction only, so the migration files stay unqualified.

const sqlMigrateSearchPath = `SELECT set_config('search_path', $1, true)`

// The lock is per schema: two stores in different schemas migrate
// independently; two processes on one schema serialize.
const sqlMigrateLock = `SELECT pg_advisory_xact_lock(hashtextextended('idem.migrate.' || current_schema(), 0))`

const sqlMigrateTable = `
CREATE TABLE IF NOT EXISTS idem_migrations (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`

const sqlMigrateApplied = `SELECT version FROM idem_migrations`

const sqlMigrateRecord = `INSERT INTO idem_migrations (version, name) VALUES ($1, $2)`

// placeholders fills a statement's {schema} with the sanitized schema (or
// nothing, to follow search_path), {cap} with whether the store counts
// active records (Config.TenantCap): a constant the planner folds, and the
// two places where a partitioned table differs (Config.Partitions):
// {conflict}, the target of ON CONFLICT, which has no unique index on
// (scope, key) to name there (the key lock keeps a key unique, see
// sqlKeyLock), and {absent}, the condition of an INSERT that does not
// read the key first.
func placeholders(schema string, tenantCap, partitioned bool) *strings.Replacer {
	prefix := ""
	if schema != "" {
		prefix = pgx.Identifier{schema}.Sanitize() + "."
	}
	conflict, absent := "(scope, key)", ""
	if partitioned {
		conflict = ""
		absent = "\nWHERE NOT EXISTS (SELECT FROM " + prefix + "idem_records x WHERE x.scope = $1 AND x.key = $2)"
	}
	return strings.NewReplacer("{schema}", prefix, "{cap}", strconv.FormatBool(tenantCap),
		"{conflict}", conflict, "{absent}", absent)
}

// queries is the statement set of one Store, with the schema resolved.
type queries struct {
	reserve, complete, release, markUnknown, checkpoint, extend string
	get, delete, sweep, sweepLock, reapDelete, reapSoft         string
	reapAbandon                                                 string
	listUnknown, resolve, deferQ, deadLetter                    string
	reserveMany, completeMany                                   string

	// The tenant cap's statements (tenant.go).
	reserveCapped, active, countActive string

	// The replay cache's (replaycache.go).
	cacheLock, cacheRegister, cacheRenew, cacheLeave, cacheNotify, cacheBehind string

	// A partitioned table's (partition.go): the key locks, and the
	// reaper's statements on the DEFAULT partition and on the one it
	// retires (its name left as partitionMark).
	keyLock, keyLocks, reapDefault, abandonDefault, reapAbandonIn string
}

func newQueries(schema string, tenantCap, partitioned bool) queries {
	r := placeholders(schema, tenantCap, partitioned)
	return queries{
		reserve:     r.Replace(sqlReserve),
		complete:    r.Replace(sqlComplete),
		release:     r.Replace(sqlRelease),
		markUnknown: r.Replace(sqlMarkUnknown),
		checkpoint:  r.Replace(sqlCheckpoint),
		extend:      r.Replace(sqlExtend),
		get:         r.Replace(sqlGet),
		delete:      r.Replace(sqlDelete),
		sweep:       r.Replace(sqlSweep),
		sweepLock:   r.Replace(sqlSweepLock),
		reapDelete:  r.Replace(sqlReapDelete),
		reapSoft:    r.Replace(sqlReapSoft),
		reapAbandon: r.Replace(sqlReapAbandon),
		listUnknown: r.Replace(sqlListUnknown),
		resolve:     r.Replace(sqlResolve),
		deferQ:      r.Replace(sqlDefer),
		deadLetter:  r.Replace(sqlDeadLetter),

		reserveMany:   r.Replace(sqlReserveMany),
		completeMany:  r.Replace(sqlCompleteMany),
		reserveCapped: r.Replace(sqlReserveCapped),
		active:        r.Replace(sqlActiveAlone),
		countActive:   r.Replace(sqlCountActive),

		cacheLock:     r.Replace(sqlCacheLock),
		cacheRegister: r.Replace(sqlCacheRegister),
		cacheRenew:    r.Replace(sqlCacheRenew),
		cacheLeave:    r.Replace(sqlCacheLeave),
		cacheNotify:   r.Replace(sqlCacheNotify),
		cacheBehind:   r.Replace(sqlCacheBehind),

		keyLock:        sqlKeyLock,
		keyLocks:       sqlKeyLocks,
		reapDefault:    r.Replace(readingFrom(sqlReapDelete, "{schema}idem_records_default")),
		abandonDefault: r.Replace(readingFrom(sqlReapAbandon, "{schema}idem_records_default")),
		reapAbandonIn:  r.Replace(readingFrom(sqlReapAbandon, partitionMark)),
	}
}

// The multi-row forms of Reserve and Complete, for the calls of one batch
// (see batch.go): one statement, one executor run and one index descent per
// row instead of one statement per call. Each input row carries its call's
// parameters and its position (ord); no key appears twice in one input (the
// batcher sends repeats as single statements after it).

// sqlReserveMany inserts the keys no row holds yet, as sqlReserve's ins
// does (in key order, so concurrent batches wait for each other's inserts
// in one order), and reports each input row's outcome:
//   - 'created' with the new row;
//   - 'existing' with the row read from the statement's snapshot when
//     reserveAction is 'none' (sqlReserve would leave it as it is);
//   - 'retry' for every other action (replace, reclaim, takeover,
//     to_unknown): the call runs sqlReserve alone, which performs it;
//   - no row when the insert conflicted with a row committed after the
//     snapshot: the call runs sqlReserve alone too.
//
// Each array is read through a scalar subquery, (SELECT $n), so that the
// planner sees no constant array even in a custom plan: its row estimate is
// then the same for every batch size, the plan cache settles on one generic
// plan after its first executions, and the statement is not planned again
// for every batch (planning this statement costs more than running it).
//
// That generic plan lives as long as the connection, and is made whenever
// the table happens to be: often empty, at a service's first requests. A
// join between the input and the table would then be planned for a table
// of a few pages (a hash join over a sequential scan) and keep scanning
// the whole table once it holds millions of rows. So cur reads each input
// row's record through a LATERAL subquery with LIMIT 1, which the planner
// can neither flatten into a join nor answer but with one primary key
// probe per input row, whatever it believes of the table's size; and cur
// is read once, for both the insert and the answer.
//
// $1 scopes, $2 keys, $3 fingerprints, $4 leases and $5 TTLs in
// microseconds, $6 lease policies, $7 nows (NULL: the database clock),
// $8 tenants, $9 owners.
var sqlReserveMany = `
WITH input AS (
	SELECT i.scope, i.key, i.fingerprint, i.lease, i.ttl, i.policy, i.tenant, i.owner, i.ord,
		coalesce(i.now_in, statement_timestamp()) AS now
	FROM unnest((SELECT $1::text[]), (SELECT $2::text[]), (SELECT $3::text[]), (SELECT $4::bigint[]),
		(SELECT $5::bigint[]), (SELECT $6::text[]), (SELECT $7::timestamptz[]), (SELECT $8::text[]),
		(SELECT $9::bigint[]))
		WITH ORDINALITY AS i(scope, key, fingerprint, lease, ttl, policy, now_in, tenant, owner, ord)
),
cur AS (
	SELECT i.ord, i.now AS in_now, i.fingerprint AS in_fingerprint, x.*
	FROM input i CROSS JOIN LATERAL (
		SELECT ` + recordColumns + `
		FROM {schema}idem_records r
		WHERE r.scope = i.scope AND r.key = i.key
		LIMIT 1
	) x
),
ins AS (
	INSERT INTO {schema}idem_records AS r
		(scope, key, fingerprint, state, fence, lease_policy, locked_until,
		 attempts, created_at, updated_at, expires_at, reap_after, tenant, active_tenant, owner)
	SELECT i.scope, i.key, i.fingerprint, 'in_progress',
		greatest((extract(epoch FROM i.now) * 1000000)::bigint, 1), i.policy,
		i.now + i.lease * interval '1 microsecond',
		1, i.now, i.now, i.now + i.ttl * interval '1 microsecond',
		i.now + i.ttl * interval '1 microsecond', i.tenant, CASE WHEN {cap} THEN i.tenant END, i.owner
	FROM input i
	WHERE NOT EXISTS (SELECT FROM cur WHERE cur.ord = i.ord)
	ORDER BY i.scope, i.key
	ON CONFLICT {conflict} DO NOTHING
	RETURNING ` + recordColumns + `
)
SELECT i.ord, 'created', ` + recordColumnsR + `
FROM input i JOIN ins r ON r.scope = i.scope AND r.key = i.key
UNION ALL
SELECT r.ord,
	CASE WHEN ` + reserveActionMany + ` = 'none' THEN 'existing' ELSE 'retry' END,
	` + recordColumnsR + `
FROM cur r`

// sqlCompleteMany is sqlComplete for several records; it returns the
// position of each input row whose record it completed. Its arrays are read
// through scalar subqueries for the reason given at sqlReserveMany.
// $1 scopes, $2 keys, $3 fences, $4 nows (NULL: the database clock),
// $5 statuses, $6 headers (JSON text), $7 bodies, $8 body omitted, $9 TTLs
// in microseconds.
var sqlCompleteMany = `
UPDATE {schema}idem_records AS r SET
	` + completing("u.status", "u.headers", "u.body", "u.omitted", "''", "coalesce(u.now_in, statement_timestamp())",
	renewedExpiry("coalesce(u.now_in, statement_timestamp())", "u.ttl"), keptReapAfter) + `
FROM unnest((SELECT $1::text[]), (SELECT $2::text[]), (SELECT $3::bigint[]), (SELECT $4::timestamptz[]),
	(SELECT $5::integer[]), (SELECT $6::text[]), (SELECT $7::bytea[]), (SELECT $8::boolean[]),
	(SELECT $9::bigint[]))
	WITH ORDINALITY AS u(scope, key, fence, now_in, status, headers, body, omitted, ttl, ord)
WHERE r.key = u.key AND r.scope = u.scope AND r.state = 'in_progress' AND r.fence = u.fence
RETURNING u.ord`
