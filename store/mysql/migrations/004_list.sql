-- Operators' listing (Store.List): newest first, and by key. InnoDB appends
-- the primary key (scope, key) to a secondary index, so the first index is
-- in the whole list order.
CREATE INDEX idem_records_created ON idem_records (created_at);
CREATE INDEX idem_records_key ON idem_records (`key`);
