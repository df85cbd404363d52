-- Operators' listing (Store.List): newest first, and by key.
CREATE INDEX idem_records_created ON idem_records (created_at DESC, scope DESC, key DESC);
CREATE INDEX idem_records_key ON idem_records (key);
