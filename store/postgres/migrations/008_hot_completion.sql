-- Completions without index writes (HOT updates).
--
-- PostgreSQL keeps an updated row on its page and writes no index entry
-- (a heap-only tuple) only when the update changes no column that an
-- index names, in its key or in its predicate. Before this migration the
-- completion changed state (named by five partial-index predicates) and
-- expires_at (the reap index): every completion wrote four index entries
-- and the insert five. Now no index names a column that a completion
-- changes, and a new key costs four index entries: the primary key, the
-- list index, the lease index and the expiry index.
--
-- Every statement here finds its work already done (IF NOT EXISTS, an
-- update that finds no row), so that an operator can run the slow steps
-- by hand beforehand without locking out writers (see
-- docs/postgres-production.md): this file then only swaps indexes, a few
-- short exclusive locks.

-- 1. The primary key leads with the key: it is also the index that finds
-- a key in every scope (the console, `idem inspect`), which replaces
-- idem_records_key_idx. ON CONFLICT (scope, key) infers a unique index
-- whatever the order of its columns.
CREATE UNIQUE INDEX IF NOT EXISTS idem_records_key_scope_idx ON idem_records (key, scope);
ALTER TABLE idem_records DROP CONSTRAINT idem_records_pkey,
    ADD CONSTRAINT idem_records_pkey PRIMARY KEY USING INDEX idem_records_key_scope_idx;
DROP INDEX IF EXISTS idem_records_key_idx;

-- 2. The reaper's index is on reap_after, a lower bound of expires_at:
-- every statement that sets expires_at sets reap_after to it, except the
-- completions, which leave it when they move expires_at later (the
-- retention starts at completion, a request's duration after the
-- reservation): the reaper walks past the few records completed within
-- that duration. NULL on a soft-expired record, which nothing reaps.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS reap_after timestamptz;
CREATE INDEX IF NOT EXISTS idem_records_reap_after_idx ON idem_records (reap_after);
-- The backfill finds the rows left through the index (NULLs are in it).
UPDATE idem_records SET reap_after = CASE WHEN state = 'expired' THEN 'infinity' ELSE expires_at END
WHERE reap_after IS NULL;

-- 3. The sweeper walks every lease once, in the order leases end, behind
-- a mark (idem_sweep_mark.swept_to): a completed record stays in this
-- index at the end of its last lease, behind the mark, and no sweep reads
-- it again. Extend, a takeover and a claim move a lease forward, ahead of
-- the mark.
CREATE INDEX IF NOT EXISTS idem_records_locked_idx ON idem_records (locked_until);
CREATE TABLE IF NOT EXISTS idem_sweep_mark (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    swept_to timestamptz NOT NULL
);
-- The mark starts at the oldest lease still held: through the old
-- partial index, before it goes.
INSERT INTO idem_sweep_mark (swept_to)
SELECT coalesce(
    (SELECT min(locked_until) FROM idem_records WHERE state = 'in_progress'),
    CASE WHEN EXISTS (SELECT FROM idem_records) THEN now() ELSE '-infinity' END)
ON CONFLICT (one) DO NOTHING;

-- 4. Unknown records by due time: reconcile_after is set exactly while a
-- record is unknown.
CREATE INDEX IF NOT EXISTS idem_records_unknown_idx ON idem_records (reconcile_after)
    WHERE reconcile_after IS NOT NULL;

-- 5. Pending records: pending_queue is the queue while the record waits
-- for a worker, NULL otherwise (a claim clears it).
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS pending_queue text;
CREATE INDEX IF NOT EXISTS idem_records_waiting_idx ON idem_records (pending_queue, created_at)
    WHERE pending_queue IS NOT NULL;
CREATE INDEX IF NOT EXISTS idem_records_waiting_deadline_idx ON idem_records (locked_until)
    WHERE pending_queue IS NOT NULL;
UPDATE idem_records SET pending_queue = queue WHERE state = 'pending' AND pending_queue IS NULL;

-- 6. The tenant cap counts active_tenant: the tenant while the record is
-- active, on a store that counts (postgres.Config.TenantCap); NULL on
-- every record of a store that does not, whose completions then stay HOT.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS active_tenant text;
CREATE INDEX IF NOT EXISTS idem_records_cap_idx ON idem_records (active_tenant)
    WHERE active_tenant IS NOT NULL;
UPDATE idem_records SET active_tenant = tenant
WHERE state NOT IN ('completed', 'failed_retryable', 'expired') AND active_tenant IS NULL;

DROP INDEX IF EXISTS idem_records_reap_idx;
DROP INDEX IF EXISTS idem_records_lease_idx;
DROP INDEX IF EXISTS idem_records_reconcile_idx;
DROP INDEX IF EXISTS idem_records_pending_idx;
DROP INDEX IF EXISTS idem_records_pending_deadline_idx;
DROP INDEX IF EXISTS idem_records_active_idx;

-- A completed version is larger than the in-progress one (it holds the
-- answer); HOT needs it on the same page. Half of each new page stays free
-- for the completions of the rows inserted into it.
ALTER TABLE idem_records SET (fillfactor = 50);
