-- idem_records holds one row per (scope, key). See store/store.go for the
-- state machine; every transition is a single guarded statement.
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
    CONSTRAINT idem_records_pkey PRIMARY KEY (scope, key),
    CONSTRAINT idem_records_state_check CHECK (state IN
        ('in_progress', 'completed', 'failed_retryable', 'unknown', 'expired')),
    CONSTRAINT idem_records_lease_policy_check CHECK (lease_policy IN
        ('unknown', 'retry', 'resume')),
    CONSTRAINT idem_records_fence_check CHECK (fence > 0),
    CONSTRAINT idem_records_completed_check CHECK
        (state <> 'completed' OR (response_status IS NOT NULL AND completed_at IS NOT NULL))
)
-- Every record is updated at least once after its insert (complete), and
-- heartbeats/checkpoints update it again. Free space on the page keeps the
-- new version on the same page: updates that touch no indexed column
-- (Checkpoint) are HOT, and the others still avoid dirtying a second page.
WITH (fillfactor = 80);

-- Reaper: terminal records by expiry. Partial, so in-flight rows never
-- enter it and the DELETE batches walk only what they may remove.
CREATE INDEX idem_records_reap_idx ON idem_records (expires_at)
    WHERE state IN ('completed', 'failed_retryable');

-- Sweeper: live and stuck leases. Small (only in-flight rows).
CREATE INDEX idem_records_lease_idx ON idem_records (locked_until)
    WHERE state = 'in_progress';

-- Reconciler: unknown records by due time.
CREATE INDEX idem_records_reconcile_idx ON idem_records (reconcile_after)
    WHERE state = 'unknown';
