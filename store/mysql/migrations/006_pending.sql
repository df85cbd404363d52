-- Asynchronous acceptance: a record may be 'pending' (accepted, kept with
-- its request, not yet claimed by a worker). One statement drops and adds
-- the check, so running it again is harmless.
ALTER TABLE idem_records
    DROP CONSTRAINT idem_records_state_chk,
    ADD CONSTRAINT idem_records_state_chk
        CHECK (state IN ('in_progress', 'completed', 'failed_retryable', 'unknown', 'expired', 'pending'));

-- queue names the workers that may claim the record; request is the
-- stored request (store.EncodeRequest). Both NULL on other records. The
-- indexes serve the workers (pending records of a queue, oldest first)
-- and the expiry of unclaimed ones (by deadline). One statement, so a
-- crash leaves all or nothing, and a rerun stops at "duplicate column".
ALTER TABLE idem_records
    ADD COLUMN queue VARBINARY(200) NULL,
    ADD COLUMN request LONGBLOB NULL,
    ADD INDEX idem_records_pending (state, queue, created_at),
    ADD INDEX idem_records_pending_deadline (state, locked_until);
