-- Operators' listing (Store.List): newest first with scope and key as
-- bytes breaking ties, and by key.
CREATE INDEX idem_records_list_idx ON idem_records
    (created_at DESC, scope COLLATE "C" DESC, key COLLATE "C" DESC);
CREATE INDEX idem_records_key_idx ON idem_records (key);
