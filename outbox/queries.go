package outbox

// Every statement of the outbox's own table, PostgreSQL first, then SQLite.
// River's tables are reached only through River's API.

// unsettledJobs is the predicate the dead-letter pass adds to River's job
// list (JobListParams.Where), the same in both dialects: the jobs that carry
// a message neither delivered nor settled (see idem_outbox_unsettled).
const unsettledJobs = `(id IN (SELECT o.job_id FROM idem_outbox o
    WHERE o.downstream_id IS NULL AND o.dead_settled_at IS NULL))`

// recordConflict is pgRecord's and sqliteRecord's answer to a message
// already recorded, the same in both dialects: the first downstream id
// ever recorded stays, with the attempts and the time of that delivery.
const recordConflict = `ON CONFLICT (key, kind) DO UPDATE
    SET downstream_id = coalesce(idem_outbox.downstream_id, excluded.downstream_id),
        attempts      = CASE WHEN idem_outbox.downstream_id IS NULL
                             THEN excluded.attempts ELSE idem_outbox.attempts END,
        delivered_at  = coalesce(idem_outbox.delivered_at, excluded.delivered_at)
RETURNING downstream_id`

// PostgreSQL.
const (
	// pgMigrateLock serialises Migrate across processes. The lock is per
	// schema, so that deployments (and tests) in different schemas of one
	// database do not wait for each other. It is a session lock because
	// River applies each of its migrations in a transaction of its own.
	pgMigrateLock   = `SELECT pg_advisory_lock(hashtextextended('idem/outbox.migrate.' || current_schema(), 0))`
	pgMigrateUnlock = `SELECT pg_advisory_unlock(hashtextextended('idem/outbox.migrate.' || current_schema(), 0))`

	pgMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_outbox_migrations (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`
	pgMigrationsApplied = `SELECT version FROM idem_outbox_migrations`
	pgMigrationInsert   = `INSERT INTO idem_outbox_migrations (version, name) VALUES ($1, $2)`

	// pgEnqueue points an undelivered message at a new job: one enqueued
	// again after it was dead-lettered is carried by the new job, whose
	// dead letter, if it dies too, is settled anew. When River skipped the
	// insert as a duplicate (the job is the row's own), and when the message
	// was delivered, the row stays as it is.
	pgEnqueue = `INSERT INTO idem_outbox (key, kind, fence, job_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (key, kind) DO UPDATE
    SET fence = excluded.fence, job_id = excluded.job_id,
        dead_calls = 0, dead_claimed_until = NULL, dead_settled_at = NULL
    WHERE idem_outbox.downstream_id IS NULL AND idem_outbox.job_id <> excluded.job_id`

	pgLookup = `SELECT fence, job_id, downstream_id, attempts, created_at, delivered_at, dead_settled_at
FROM idem_outbox WHERE key = $1 AND kind = $2`

	// pgRecord keeps the first downstream id ever recorded for the message
	// and returns it: a concurrent or later delivery cannot replace it
	// (recordConflict).
	pgRecord = `INSERT INTO idem_outbox (key, kind, fence, job_id, downstream_id, attempts, delivered_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
` + recordConflict

	// pgUndelivered returns those of the given jobs that still carry an
	// undelivered message, with the time their dead letter was settled.
	pgUndelivered = `SELECT job_id, dead_settled_at FROM idem_outbox
WHERE job_id = ANY($1) AND downstream_id IS NULL`

	// pgDeadClaim claims the dead message ($1, $2) carried by job $3 for
	// one call of OnDead, for $4 microseconds, unless it is settled (or
	// delivered, or carried by another job now) or another pass holds an
	// unexpired claim; it returns the claim's number, 1 for the first.
	pgDeadClaim = `UPDATE idem_outbox
SET dead_calls = dead_calls + 1,
    dead_claimed_until = now() + $4::bigint * interval '1 microsecond'
WHERE key = $1 AND kind = $2 AND job_id = $3
  AND downstream_id IS NULL AND dead_settled_at IS NULL
  AND (dead_claimed_until IS NULL OR dead_claimed_until <= now())
RETURNING dead_calls`

	// pgDeadRelease ends claim number $4 without settling: a pass calls
	// OnDead again once $5 microseconds have passed. A later claim (this
	// one expired) is left alone.
	pgDeadRelease = `UPDATE idem_outbox SET dead_claimed_until = now() + $5::bigint * interval '1 microsecond'
WHERE key = $1 AND kind = $2 AND job_id = $3 AND dead_calls = $4 AND dead_settled_at IS NULL`

	// pgDeadSettle records that OnDead returned nil.
	pgDeadSettle = `UPDATE idem_outbox SET dead_settled_at = now(), dead_claimed_until = NULL
WHERE key = $1 AND kind = $2 AND job_id = $3 AND dead_settled_at IS NULL`
)

// SQLite. Times are unix microseconds passed by the caller: SQLite is
// embedded, so the process clock is the database's clock.
const (
	sqliteMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_outbox_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL
)`
	sqliteMigrationsApplied = `SELECT version FROM idem_outbox_migrations`
	sqliteMigrationInsert   = `INSERT INTO idem_outbox_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)`

	sqliteEnqueue = `INSERT INTO idem_outbox (key, kind, fence, job_id, created_at)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (key, kind) DO UPDATE
    SET fence = excluded.fence, job_id = excluded.job_id,
        dead_calls = 0, dead_claimed_until = NULL, dead_settled_at = NULL
    WHERE idem_outbox.downstream_id IS NULL AND idem_outbox.job_id <> excluded.job_id`

	sqliteLookup = `SELECT fence, job_id, downstream_id, attempts, created_at, delivered_at, dead_settled_at
FROM idem_outbox WHERE key = ?1 AND kind = ?2`

	sqliteRecord = `INSERT INTO idem_outbox (key, kind, fence, job_id, downstream_id, attempts, created_at, delivered_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)
` + recordConflict

	// ?1 is a JSON array of job ids.
	sqliteUndelivered = `SELECT job_id, dead_settled_at FROM idem_outbox
WHERE job_id IN (SELECT value FROM json_each(?1)) AND downstream_id IS NULL`

	// ?4 is now, ?5 the end of the claim.
	sqliteDeadClaim = `UPDATE idem_outbox
SET dead_calls = dead_calls + 1, dead_claimed_until = ?5
WHERE key = ?1 AND kind = ?2 AND job_id = ?3
  AND downstream_id IS NULL AND dead_settled_at IS NULL
  AND (dead_claimed_until IS NULL OR dead_claimed_until <= ?4)
RETURNING dead_calls`

	// ?5 is when a pass may claim it again.
	sqliteDeadRelease = `UPDATE idem_outbox SET dead_claimed_until = ?5
WHERE key = ?1 AND kind = ?2 AND job_id = ?3 AND dead_calls = ?4 AND dead_settled_at IS NULL`

	// ?4 is now.
	sqliteDeadSettle = `UPDATE idem_outbox SET dead_settled_at = ?4, dead_claimed_until = NULL
WHERE key = ?1 AND kind = ?2 AND job_id = ?3 AND dead_settled_at IS NULL`
)
