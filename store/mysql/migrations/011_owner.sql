-- owner is Record.Owner: the ReserveParams.Owner of the Reserve that
-- started the record's current execution. NULL on the records older than
-- this migration, which read as Owner 0. A nullable column with no default,
-- added last, is a change of metadata only on MariaDB >= 10.3 and
-- MySQL >= 8.0.12 (ALGORITHM=INSTANT, which both choose by themselves): no
-- rows are rewritten. Migrate treats "duplicate column" as done, so the step
-- can run again after a crash between it and its idem_migrations row.
ALTER TABLE idem_records ADD COLUMN owner BIGINT NULL
