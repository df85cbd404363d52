-- idem_records partitioned by retention (postgres.Config.Partitions): the
-- shape migrations 001 to 008 give the plain table, created at once on a
-- fresh schema, which then counts those migrations as applied.
--
-- The table is partitioned by RANGE on reap_after, the instant from which
-- the reaper may remove the record. A unique index of a partitioned table
-- must hold its partition key, so the primary key is (key, scope,
-- reap_after): it finds a key in each partition with the same probe as the
-- plain table's (key, scope), but it does not keep a key from being in two
-- partitions at once. Every statement that creates a record takes a
-- transaction-scoped advisory lock on the hash of its scope and key first,
-- and looks the key up across the partitions after the lock is held (see
-- sqlKeyLock).
--
-- No index on reap_after: the reaper drops whole partitions whose range has
-- passed (after moving out the few records it must keep). A new key writes
-- three index entries: the primary key, the list index and the lease index.
CREATE TABLE idem_records (
    scope                 text        NOT NULL,
    key                   text        NOT NULL,
    fingerprint           text        NOT NULL,
    state                 text        NOT NULL,
    fence                 bigint      NOT NULL,
    lease_policy          text        NOT NULL,
    locked_until          timestamptz NOT NULL,
    recovery_point        text        NOT NULL DEFAULT '',
    response_status       integer,
    response_headers      jsonb,
    response_body         bytea,
    response_body_omitted boolean     NOT NULL DEFAULT false,
    last_error            text        NOT NULL DEFAULT '',
    attempts              integer     NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    completed_at          timestamptz,
    expires_at            timestamptz NOT NULL,
    reconcile_after       timestamptz,
    reconcile_attempts    integer     NOT NULL DEFAULT 0,
    dead_lettered_at      timestamptz,
    queue                 text,
    request               bytea,
    tenant                text        NOT NULL DEFAULT '',
    reap_after            timestamptz NOT NULL,
    pending_queue         text,
    active_tenant         text,
    CONSTRAINT idem_records_pkey PRIMARY KEY (key, scope, reap_after),
    CONSTRAINT idem_records_state_check CHECK (state IN
        ('in_progress', 'completed', 'failed_retryable', 'unknown', 'expired', 'pending')),
    CONSTRAINT idem_records_lease_policy_check CHECK (lease_policy IN
        ('unknown', 'retry', 'resume')),
    CONSTRAINT idem_records_fence_check CHECK (fence > 0),
    CONSTRAINT idem_records_completed_check CHECK
        (state <> 'completed' OR (response_status IS NOT NULL AND completed_at IS NOT NULL))
) PARTITION BY RANGE (reap_after);

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

-- As in migration 008.
CREATE TABLE idem_sweep_mark (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    swept_to timestamptz NOT NULL
);
INSERT INTO idem_sweep_mark (swept_to) VALUES ('-infinity');
