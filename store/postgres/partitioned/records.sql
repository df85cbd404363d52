-- idem_records partitioned by retention (postgres.Config.Partitions), made
-- on a fresh schema from the plain table that migrations 001 to 008 have
-- just created there (createPartitioned), so that the columns, their
-- types, defaults and NOT NULL, and the CHECK constraints have one source:
-- the migrations. Those migrations also made idem_sweep_mark; what this
-- file adds is only what the partitioned shape does differently: the
-- primary key, the indexes and the partitions.
--
-- The table is partitioned by RANGE on reap_after, the instant from which
-- the reaper may remove the record. A unique index of a partitioned table
-- must hold its partition key, so the primary key is (key, scope,
-- reap_after) (which also makes reap_after NOT NULL): it finds a key in
-- each partition with the same probe as the plain table's (key, scope),
-- but it does not keep a key from being in two partitions at once. Every
-- statement that creates a record takes a transaction-scoped advisory lock
-- on the hash of its scope and key first, and looks the key up across the
-- partitions after the lock is held (see sqlKeyLock).
--
-- No index on reap_after: the reaper drops whole partitions whose range has
-- passed (after moving out the few records it must keep). A new key writes
-- three index entries: the primary key, the list index and the lease index.
ALTER TABLE idem_records RENAME TO idem_records_plain;
-- Everything of the columns but the indexes; the table's storage
-- parameters (fillfactor) are the partitions' own.
CREATE TABLE idem_records (LIKE idem_records_plain INCLUDING ALL EXCLUDING INDEXES)
    PARTITION BY RANGE (reap_after);
-- Before the primary key, whose index takes the plain one's name.
DROP TABLE idem_records_plain;
ALTER TABLE idem_records ADD CONSTRAINT idem_records_pkey PRIMARY KEY (key, scope, reap_after);

-- The indexes of migrations 004 and 008 but the reaper's.
CREATE INDEX idem_records_list_idx ON idem_records
    (created_at DESC, scope COLLATE "C" DESC, key COLLATE "C" DESC);
CREATE INDEX idem_records_locked_idx ON idem_records (locked_until);
CREATE INDEX idem_records_unknown_idx ON idem_records (reconcile_after)
    WHERE reconcile_after IS NOT NULL;
CREATE INDEX idem_records_waiting_idx ON idem_records (pending_queue, created_at)
    WHERE pending_queue IS NOT NULL;
CREATE INDEX idem_records_waiting_deadline_idx ON idem_records (locked_until)
    WHERE pending_queue IS NOT NULL;
CREATE INDEX idem_records_cap_idx ON idem_records (active_tenant)
    WHERE active_tenant IS NOT NULL;

-- Soft-expired records (reap_after 'infinity') are kept for good.
CREATE TABLE idem_records_infinity PARTITION OF idem_records
    FOR VALUES FROM ('infinity') TO (MAXVALUE) WITH (fillfactor = 50);

-- Records whose reap_after no partition covers: past the partitions made
-- ahead of time (a TTL longer than they reach, or a reaper that has not
-- run), or before the oldest one. Creating a partition moves its records
-- out of here; the reaper removes this partition's expired records one by
-- one, through its own index on reap_after.
CREATE TABLE idem_records_default PARTITION OF idem_records DEFAULT WITH (fillfactor = 50);
CREATE INDEX idem_records_default_reap_idx ON idem_records_default (reap_after);
