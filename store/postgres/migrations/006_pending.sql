-- Asynchronous acceptance: a record may be 'pending' (accepted, kept with
-- its request, not yet claimed by a worker).
ALTER TABLE idem_records DROP CONSTRAINT idem_records_state_check;
ALTER TABLE idem_records ADD CONSTRAINT idem_records_state_check CHECK (state IN
    ('in_progress', 'completed', 'failed_retryable', 'unknown', 'expired', 'pending'));

-- queue names the workers that may claim the record; request is the
-- stored request (store.EncodeRequest). Both NULL on other records.
ALTER TABLE idem_records ADD COLUMN queue text, ADD COLUMN request bytea;

-- Workers: pending records of a queue, oldest first.
CREATE INDEX idem_records_pending_idx ON idem_records (queue, created_at)
    WHERE state = 'pending';
-- Expiry of unclaimed pending records by deadline.
CREATE INDEX idem_records_pending_deadline_idx ON idem_records (locked_until)
    WHERE state = 'pending';
