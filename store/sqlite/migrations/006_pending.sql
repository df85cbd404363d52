-- Asynchronous acceptance: a record may be 'pending' (accepted, kept with
-- its request, not yet claimed by a worker).
--
-- SQLite cannot alter a CHECK constraint, and rebuilding the table would
-- have to name every column of every later migration. Loosening a CHECK
-- does not change the file's content, so the documented procedure for
-- such changes applies: rewrite the table's definition in sqlite_schema,
-- then reset this connection's copy of the schema. The DDL that follows
-- (in this same transaction) bumps the schema cookie, so every other
-- connection reloads the definition.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''unknown'', ''expired'')', '''unknown'', ''expired'', ''pending'')')
 WHERE type = 'table' AND name = 'idem_records';
PRAGMA writable_schema = RESET;
-- Fail the migration (and roll it back) if the definition was not the one
-- expected: the CHECK below refuses 0.
CREATE TEMP TABLE idem_pending_check (patched INTEGER CHECK (patched));
INSERT INTO idem_pending_check
    SELECT instr(sql, '''expired'', ''pending'')') > 0 FROM sqlite_schema
     WHERE type = 'table' AND name = 'idem_records';
DROP TABLE idem_pending_check;

-- queue names the workers that may claim the record; request is the
-- stored request (store.EncodeRequest). Both NULL on other records.
ALTER TABLE idem_records ADD COLUMN queue TEXT;
ALTER TABLE idem_records ADD COLUMN request BLOB;

-- Workers: pending records of a queue, oldest first.
CREATE INDEX idem_records_pending ON idem_records (queue, created_at)
    WHERE state = 'pending';
-- Expiry of unclaimed pending records by deadline.
CREATE INDEX idem_records_pending_deadline ON idem_records (locked_until)
    WHERE state = 'pending';
