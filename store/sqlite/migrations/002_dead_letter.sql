-- dead_lettered_at is set (unix microseconds) when the reconciler gives up
-- on an unknown record; a dead-lettered record is never due again, and
-- Resolve clears it. NULL otherwise.
ALTER TABLE idem_records ADD COLUMN dead_lettered_at INTEGER;
