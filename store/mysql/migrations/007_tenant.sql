-- tenant is the caller a record is counted against (ReserveParams.Tenant),
-- for the cap on a tenant's active records, with the index the count
-- walks (MySQL has no partial index: by tenant, then state). One statement,
-- so that a rerun after a crash stops at "duplicate column" as done.
-- Records older than this migration belong to tenant ''.
ALTER TABLE idem_records
    ADD COLUMN tenant VARBINARY(1024) NOT NULL DEFAULT '',
    ADD INDEX idem_records_active (tenant(255), state);

-- One row per tenant that reserved under a cap, by the SHA-256 of its
-- name: a capped reservation locks its tenant's row for the length of its
-- transaction, so the count of the tenant's active records and the
-- reservation are one step.
CREATE TABLE IF NOT EXISTS idem_tenants (
    tenant_hash BINARY(32) NOT NULL PRIMARY KEY
)
