-- dead_lettered_at is set when the reconciler gives up on an unknown
-- record: it is never due again, and Resolve clears it. NULL otherwise.
ALTER TABLE idem_records ADD COLUMN dead_lettered_at timestamptz;
