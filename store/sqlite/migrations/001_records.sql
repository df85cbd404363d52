-- idem_records holds one idempotency record per (scope, key); see
-- store.Record for the meaning of each field.
--
-- Times are integer unix microseconds (UTC): comparisons are exact, indexable
-- and independent of any text format. A NULL time is the zero time.Time.
CREATE TABLE idem_records (
    scope                 TEXT    NOT NULL,
    key                   TEXT    NOT NULL,
    fingerprint           TEXT    NOT NULL,
    state                 TEXT    NOT NULL
        CHECK (state IN ('in_progress', 'completed', 'failed_retryable', 'unknown', 'expired')),
    fence                 INTEGER NOT NULL CHECK (fence > 0),
    lease_policy          TEXT    NOT NULL
        CHECK (lease_policy IN ('unknown', 'retry', 'resume')),
    locked_until          INTEGER NOT NULL,
    recovery_point        TEXT    NOT NULL DEFAULT '',
    -- response_status is NULL when no response is stored; the other
    -- response_* columns are meaningful only when it is set.
    response_status       INTEGER,
    response_headers      TEXT,   -- JSON object of http.Header
    response_body         BLOB,
    response_body_omitted INTEGER NOT NULL DEFAULT 0 CHECK (response_body_omitted IN (0, 1)),
    last_error            TEXT    NOT NULL DEFAULT '',
    attempts              INTEGER NOT NULL,
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL,
    completed_at          INTEGER,
    expires_at            INTEGER NOT NULL,
    reconcile_after       INTEGER,
    reconcile_attempts    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, key)
);

-- Reaper: terminal records by expiry. The WHERE clauses of these partial
-- indexes are repeated verbatim in the queries so SQLite can use them.
CREATE INDEX idem_records_reap ON idem_records (expires_at)
    WHERE state IN ('completed', 'failed_retryable');

-- Reaper: in_progress and unknown records past expiry become abandoned.
CREATE INDEX idem_records_abandon ON idem_records (expires_at)
    WHERE state IN ('in_progress', 'unknown');

-- Sweeper: in_progress records by lease end, per policy (only policy unknown
-- is swept; retry/resume wait for a takeover).
CREATE INDEX idem_records_sweep ON idem_records (lease_policy, locked_until)
    WHERE state = 'in_progress';

-- Reconciliation: unknown records by due time.
CREATE INDEX idem_records_reconcile ON idem_records (reconcile_after)
    WHERE state = 'unknown';
