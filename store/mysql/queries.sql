-- The statements of the MySQL/MariaDB store that share no piece of logic
-- with another. Those that do (the SET list that completes a record, the
-- reaper's choice of expired records, the tenant cap's check with and
-- without locks) are composed in queries.go from
-- pieces written once, and the queue's in pending.go, in the same form.
--
-- Each block starts with "-- name: NAME". Parameters are written :name and
-- compiled to positional ? placeholders when the package loads; one name may
-- appear several times. {record_columns} expands to the column list that
-- scanRecord reads.
--
-- Time: :now is NULL when the store uses the server's clock and a UTC
-- 'YYYY-MM-DD hh:mm:ss.ffffff' string when a Clock is injected, so every
-- statement reads the time as (sqlNow in queries.go)
--     COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))
-- UTC_TIMESTAMP, not NOW(): NOW() follows the session time_zone. All calls in
-- one statement return the same instant.

-- name: record_columns
scope, `key`, fingerprint, state, fence, lease_policy, locked_until,
recovery_point, response_status, response_headers, response_body,
response_body_omitted, last_error, attempts, created_at, updated_at,
completed_at, expires_at, reconcile_after, reconcile_attempts, dead_lettered_at,
owner

-- name: reserve_upsert
-- The whole of Store.Reserve in one statement. The VALUES row is a fresh
-- record; when (scope, key) exists, the first assignment decides the
-- transition from the old row and leaves the decision in LAST_INSERT_ID, a
-- per-session value every later assignment reads:
--     0 existing, untouched      1 created (absent, expired, terminal past expires_at)
--     2 reclaimed                3 taken over        4 lease expired -> unknown
-- The fresh-insert path sets LAST_INSERT_ID(1) through the fence value, and
-- the SELECT that follows reads the decision back with LAST_INSERT_ID().
--
-- Fences follow store.NextFence: a fresh row's is the statement's instant in
-- microseconds since the epoch (GREATEST with LAST_INSERT_ID(1), which is 1,
-- keeps it positive), and a transition that issues a new fence takes the
-- greater of that and the old fence + 1.
--
-- Why LAST_INSERT_ID and not one IF() per column over the old values: later
-- assignments see the new values of earlier ones (MySQL, MariaDB by default)
-- or the old ones (MariaDB with sql_mode SIMULTANEOUS_ASSIGNMENT). Every
-- assignment below reads only its own column, VALUES() and LAST_INSERT_ID(),
-- so it means the same in both modes. LAST_INSERT_ID(expr) is documented on
-- both servers and, unlike assigning @variables inside expressions, is not
-- deprecated on MySQL 8.
--
-- VALUES(col) is the value the insert would have written; MySQL >= 8.0.20
-- deprecates it in favour of a row alias (INSERT ... AS new), which MariaDB
-- does not support, so VALUES() is the portable spelling.
--
-- When the decision is 0 every assignment yields the old value, so InnoDB
-- writes nothing: a replay takes the row lock but changes no row, writes no
-- undo and logs nothing to the binlog.
INSERT INTO idem_records (
    scope, `key`, fingerprint, state, fence, lease_policy, locked_until,
    recovery_point, response_status, response_headers, response_body,
    response_body_omitted, last_error, attempts, created_at, updated_at,
    completed_at, expires_at, reconcile_after, reconcile_attempts, row_version,
    tenant, owner
) VALUES (
    :scope, :key, :fingerprint, 'in_progress',
    GREATEST(LAST_INSERT_ID(1), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00',
        COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)))),
    :lease_policy,
    DATE_ADD(COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)), INTERVAL :lease_us MICROSECOND),
    '', NULL, NULL, NULL,
    FALSE, '', 1,
    COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    NULL,
    DATE_ADD(COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)), INTERVAL :ttl_us MICROSECOND),
    NULL, 0, 0,
    :tenant, :owner
) ON DUPLICATE KEY UPDATE
    -- Must stay the first assignment: it is the only one that reads other
    -- columns, and they are still the old row here in either mode.
    fence = IF(LAST_INSERT_ID(CASE
        WHEN state = 'expired'
          OR (state IN ('completed', 'failed_retryable') AND expires_at <= VALUES(updated_at)) THEN 1
        WHEN fingerprint <> VALUES(fingerprint) THEN 0
        WHEN state = 'failed_retryable' THEN 2
        WHEN state = 'in_progress' AND locked_until <= VALUES(updated_at)
         AND lease_policy IN ('retry', 'resume') THEN 3
        WHEN state = 'in_progress' AND locked_until <= VALUES(updated_at) THEN 4
        ELSE 0
    END) IN (1, 2, 3), GREATEST(fence + 1, VALUES(fence)), fence),
    state = CASE
        WHEN LAST_INSERT_ID() IN (1, 2, 3) THEN 'in_progress'
        WHEN LAST_INSERT_ID() = 4 THEN 'unknown'
        ELSE state
    END,
    fingerprint           = IF(LAST_INSERT_ID() = 1, VALUES(fingerprint), fingerprint),
    tenant                = IF(LAST_INSERT_ID() = 1, VALUES(tenant), tenant),
    lease_policy          = IF(LAST_INSERT_ID() = 1, VALUES(lease_policy), lease_policy),
    locked_until          = IF(LAST_INSERT_ID() IN (1, 2, 3), VALUES(locked_until), locked_until),
    -- The decisions that start an execution give it to this Reserve; the
    -- lease expiring to unknown keeps the Owner of the execution in doubt.
    owner                 = IF(LAST_INSERT_ID() IN (1, 2, 3), VALUES(owner), owner),
    recovery_point        = IF(LAST_INSERT_ID() = 1, '', recovery_point),
    response_status       = IF(LAST_INSERT_ID() = 1, NULL, response_status),
    response_headers      = IF(LAST_INSERT_ID() = 1, NULL, response_headers),
    response_body         = IF(LAST_INSERT_ID() = 1, NULL, response_body),
    response_body_omitted = IF(LAST_INSERT_ID() = 1, FALSE, response_body_omitted),
    last_error = CASE
        WHEN LAST_INSERT_ID() IN (1, 2, 3) THEN ''
        WHEN LAST_INSERT_ID() = 4 THEN 'lease_expired'
        ELSE last_error
    END,
    attempts = CASE
        WHEN LAST_INSERT_ID() = 1 THEN 1
        WHEN LAST_INSERT_ID() IN (2, 3) THEN attempts + 1
        ELSE attempts
    END,
    created_at            = IF(LAST_INSERT_ID() = 1, VALUES(created_at), created_at),
    updated_at            = IF(LAST_INSERT_ID() <> 0, VALUES(updated_at), updated_at),
    completed_at          = IF(LAST_INSERT_ID() = 1, NULL, completed_at),
    expires_at            = IF(LAST_INSERT_ID() IN (1, 2), VALUES(expires_at), expires_at),
    reconcile_after = CASE
        WHEN LAST_INSERT_ID() IN (1, 2, 3) THEN NULL
        WHEN LAST_INSERT_ID() = 4 THEN VALUES(updated_at)
        ELSE reconcile_after
    END,
    reconcile_attempts    = IF(LAST_INSERT_ID() IN (1, 2, 3), 0, reconcile_attempts),
    row_version           = row_version + (LAST_INSERT_ID() <> 0)

-- name: tenant_lock
-- The tenant cap: locks the tenant's row until the transaction ends (an
-- upsert that changes nothing still takes the row's exclusive lock).
INSERT INTO idem_tenants (tenant_hash) VALUES (UNHEX(SHA2(:tenant, 256)))
ON DUPLICATE KEY UPDATE tenant_hash = tenant_hash

-- name: count_active
-- The active records of every tenant (store.ActiveCounter), counting no
-- further than :limit.
SELECT COUNT(*) FROM (
    SELECT 1 FROM idem_records
    -- The active states named, so that the index leading with state
    -- (idem_records_pending) serves the count.
    WHERE state IN ('pending', 'in_progress', 'unknown')
    LIMIT :limit) a

-- name: reserve_select
-- FOR UPDATE reads the latest version even when ReserveTx runs in a caller's
-- transaction whose snapshot is older than the row; the upsert already holds
-- the row's exclusive lock, so it never waits.
SELECT LAST_INSERT_ID(), {record_columns}
FROM idem_records
WHERE scope = :scope AND `key` = :key
FOR UPDATE

-- name: release
UPDATE idem_records SET
    state = 'failed_retryable',
    queue = NULL,
    request = NULL,
    last_error = :error,
    updated_at = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    row_version = row_version + 1
WHERE scope = :scope AND `key` = :key AND state = 'in_progress' AND fence = :fence

-- name: mark_unknown
-- :request is the request summary; NULL keeps the request the record holds.
UPDATE idem_records SET
    state = 'unknown',
    last_error = :error,
    reconcile_after = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    updated_at = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    request = COALESCE(:request, request),
    row_version = row_version + 1
WHERE scope = :scope AND `key` = :key AND state = 'in_progress' AND fence = :fence

-- name: checkpoint
UPDATE idem_records SET
    recovery_point = :recovery_point,
    updated_at = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    row_version = row_version + 1
WHERE scope = :scope AND `key` = :key AND state = 'in_progress' AND fence = :fence

-- name: extend
UPDATE idem_records SET
    locked_until = DATE_ADD(COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)), INTERVAL :lease_us MICROSECOND),
    updated_at = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    row_version = row_version + 1
WHERE scope = :scope AND `key` = :key AND state = 'in_progress' AND fence = :fence

-- name: get
-- The request of an unknown record (an operator settles it from that),
-- none of a pending or in-progress one (the worker's, possibly large):
-- other records pay nothing for it, as a terminal record keeps none.
SELECT {record_columns},
    CASE WHEN state NOT IN ('pending', 'in_progress') THEN queue END,
    CASE WHEN state NOT IN ('pending', 'in_progress') THEN request END
FROM idem_records
WHERE scope = :scope AND `key` = :key

-- name: state
-- Explains a guarded statement's miss: it locks the row (when there is one)
-- so that the statement, run again, and this read see the same row.
SELECT state, fence FROM idem_records WHERE scope = :scope AND `key` = :key
FOR UPDATE

-- name: delete
-- :fence is the fence the record must still have, 0 for any.
DELETE FROM idem_records WHERE scope = :scope AND `key` = :key AND state <> 'in_progress'
  AND (:fence = 0 OR fence = :fence)

-- name: sweep_select
-- SKIP LOCKED (MariaDB >= 10.6, MySQL >= 8.0) lets several sweepers share
-- the work: each locks a disjoint batch. The statement's instant comes back
-- with the rows so that the updates, and the records returned, use it.
SELECT {record_columns}, COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))
FROM idem_records
WHERE state = 'in_progress' AND lease_policy = 'unknown'
  AND locked_until <= DATE_SUB(COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)), INTERVAL :grace_us MICROSECOND)
ORDER BY locked_until
LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: sweep_update
UPDATE idem_records SET
    state = 'unknown',
    last_error = 'lease_expired',
    reconcile_after = CAST(:now AS DATETIME(6)),
    updated_at = CAST(:now AS DATETIME(6)),
    row_version = row_version + 1
WHERE scope = :scope AND `key` = :key AND state = 'in_progress' AND fence = :fence

-- name: list_unknown_due
SELECT {record_columns}
FROM idem_records
WHERE state = 'unknown'
  AND reconcile_after <= COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))
  AND dead_lettered_at IS NULL
ORDER BY reconcile_after, scope, `key`
LIMIT :limit

-- name: list_unknown_all
SELECT {record_columns}
FROM idem_records
WHERE state = 'unknown'
ORDER BY reconcile_after, scope, `key`
LIMIT :limit

-- name: defer
UPDATE idem_records SET
    reconcile_attempts = reconcile_attempts + 1,
    reconcile_after = DATE_ADD(COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)), INTERVAL :delay_us MICROSECOND),
    last_error = :error,
    updated_at = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    row_version = row_version + 1
WHERE scope = :scope AND `key` = :key AND state = 'unknown'
  AND fence = :fence AND reconcile_attempts = :attempts

-- name: dead_letter
UPDATE idem_records SET
    reconcile_attempts = reconcile_attempts + 1,
    dead_lettered_at = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    last_error = :error,
    updated_at = COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6)),
    row_version = row_version + 1
WHERE scope = :scope AND `key` = :key AND state = 'unknown'
  AND fence = :fence AND reconcile_attempts = :attempts

-- name: migrate_lock
-- GET_LOCK names are server-wide: the database name keeps stores in different
-- databases from waiting on each other. Names are limited to 64 characters
-- on MySQL; a truncated name only makes two databases share one lock.
SELECT GET_LOCK(LEFT(CONCAT('idem_migrate.', DATABASE()), 64), :timeout_s)

-- name: migrate_unlock
SELECT RELEASE_LOCK(LEFT(CONCAT('idem_migrate.', DATABASE()), 64))

-- name: migrate_table
CREATE TABLE IF NOT EXISTS idem_migrations (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4

-- name: migrate_applied
SELECT version FROM idem_migrations

-- name: migrate_record
INSERT INTO idem_migrations (version, name, applied_at) VALUES (:version, :name, UTC_TIMESTAMP(6))

-- name: rollback
-- Ends the transaction a failed Reserve batch may have left open.
ROLLBACK

-- name: probe_batch
-- Succeeds only on a connection that interpolates parameters client-side and
-- accepts several statements per query: what Reserve's one-round-trip batch
-- needs.
SELECT :one; SELECT :two
