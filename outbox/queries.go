package outbox

// Every statement of the outbox's own table, PostgreSQL first, then SQLite.
// River's tables are reached only through River's API.

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
	// again after it was dead-lettered is carried by the new job. When River
	// skipped the insert as a duplicate (the job is the row's own), and when
	// the message was delivered, the row stays as it is.
	pgEnqueue = `INSERT INTO idem_outbox (key, kind, fence, job_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (key, kind) DO UPDATE
    SET fence = excluded.fence, job_id = excluded.job_id
    WHERE idem_outbox.downstream_id IS NULL AND idem_outbox.job_id <> excluded.job_id`

	pgLookup = `SELECT fence, job_id, downstream_id, attempts, created_at, delivered_at
FROM idem_outbox WHERE key = $1 AND kind = $2`

	// pgRecord keeps the first downstream id ever recorded for the message
	// and returns it: a concurrent or later delivery cannot replace it
	// (recordConflict).
	pgRecord = `INSERT INTO idem_outbox (key, kind, fence, job_id, downstream_id, attempts, delivered_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
` + recordConflict

	// pgUndelivered returns those of the given jobs that still carry an
	// undelivered message.
	pgUndelivered = `SELECT job_id FROM idem_outbox
WHERE job_id = ANY($1) AND downstream_id IS NULL`
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
    SET fence = excluded.fence, job_id = excluded.job_id
    WHERE idem_outbox.downstream_id IS NULL AND idem_outbox.job_id <> excluded.job_id`

	sqliteLookup = `SELECT fence, job_id, downstream_id, attempts, created_at, delivered_at
FROM idem_outbox WHERE key = ?1 AND kind = ?2`

	sqliteRecord = `INSERT INTO idem_outbox (key, kind, fence, job_id, downstream_id, attempts, created_at, delivered_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)
` + recordConflict

	// ?1 is a JSON array of job ids.
	sqliteUndelivered = `SELECT job_id FROM idem_outbox
WHERE job_id IN (SELECT value FROM json_each(?1)) AND downstream_id IS NULL`
)
