-- The dead-letter pass: for each message whose River job was discarded or
-- cancelled, OnDead is called until it returns nil. These columns describe
-- the message's current job (idem_outbox.job_id); enqueuing the message
-- again, which points the row at a new job, clears them.
--
-- Messages already dead when this migration runs are settled again by the
-- first pass: OnDead is idempotent.
--
-- The columns are added without rewriting the table; the index is built
-- here in the migration's transaction, which holds off enqueues while it
-- reads the table. On a large table, create it first with CREATE INDEX
-- CONCURRENTLY (docs/postgres-production.md, "The outbox's dead letters"):
-- this one then finds it and does nothing.
ALTER TABLE idem_outbox
    -- the number of times a pass claimed the dead message to call OnDead
    ADD COLUMN IF NOT EXISTS dead_calls         integer NOT NULL DEFAULT 0,
    -- a pass is calling OnDead for it until then; another pass waits
    ADD COLUMN IF NOT EXISTS dead_claimed_until timestamptz,
    -- when OnDead returned nil for it; never called again after
    ADD COLUMN IF NOT EXISTS dead_settled_at    timestamptz;

-- The pass looks for dead jobs among those of the messages neither
-- delivered nor settled.
CREATE INDEX IF NOT EXISTS idem_outbox_unsettled ON idem_outbox (job_id)
    WHERE downstream_id IS NULL AND dead_settled_at IS NULL;
