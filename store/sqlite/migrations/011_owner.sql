-- owner is the ReserveParams.Owner of the Reserve that started the
-- record's current execution (store.Record.Owner). NULL, read as 0, on a
-- record no Reserve started (a pending one) and on every record written
-- before this migration. A column added without a default rewrites no
-- row: the upgrade is instant whatever the table's size.
ALTER TABLE idem_records ADD COLUMN owner INTEGER;
