-- dead_lettered_at is set when the reconciler gives up on an unknown
-- record: it is never due again, and Resolve clears it. NULL otherwise.
-- Migrate treats "duplicate column" as done, so the step can run again
-- after a crash between it and its idem_migrations row (MySQL has no
-- ADD COLUMN IF NOT EXISTS).
ALTER TABLE idem_records ADD COLUMN dead_lettered_at DATETIME(6) NULL
