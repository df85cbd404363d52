-- tenant is the caller a record is counted against (ReserveParams.Tenant),
-- for the cap on a tenant's active records. Records older than this
-- migration belong to tenant ''.
ALTER TABLE idem_records ADD COLUMN tenant TEXT NOT NULL DEFAULT '';

-- The cap counts a tenant's active records: every state but the terminal
-- ones and expired. The WHERE clause is repeated verbatim in qActive.
CREATE INDEX idem_records_active ON idem_records (tenant)
    WHERE state NOT IN ('completed', 'failed_retryable', 'expired');
