-- tenant is the caller a record is counted against (ReserveParams.Tenant),
-- for the cap on a tenant's active records. Records older than this
-- migration belong to tenant ''.
ALTER TABLE idem_records ADD COLUMN tenant text NOT NULL DEFAULT '';

-- The cap counts a tenant's active records: every state but the terminal
-- ones and expired. Partial, so it holds only what is in flight.
CREATE INDEX idem_records_active_idx ON idem_records (tenant)
    WHERE state NOT IN ('completed', 'failed_retryable', 'expired');
