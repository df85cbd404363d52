-- The dead-letter pass: for each message whose River job was discarded or
-- cancelled, OnDead is called until it returns nil. These columns describe
-- the message's current job (idem_outbox.job_id); enqueuing the message
-- again, which points the row at a new job, clears them.
--
-- Messages already dead when this migration runs are settled again by the
-- first pass: OnDead is idempotent.

-- the number of times a pass claimed the dead message to call OnDead
ALTER TABLE idem_outbox ADD COLUMN dead_calls INTEGER NOT NULL DEFAULT 0;
-- a pass is calling OnDead for it until then (unix microseconds); another
-- pass waits
ALTER TABLE idem_outbox ADD COLUMN dead_claimed_until INTEGER;
-- when OnDead returned nil for it (unix microseconds); never called again
-- after
ALTER TABLE idem_outbox ADD COLUMN dead_settled_at INTEGER;

-- The pass looks for dead jobs among those of the messages neither
-- delivered nor settled.
CREATE INDEX idem_outbox_unsettled ON idem_outbox (job_id)
    WHERE downstream_id IS NULL AND dead_settled_at IS NULL;
