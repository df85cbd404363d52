-- idem_records holds one row per (scope, key).
--
-- scope and key are VARBINARY, not VARCHAR ... COLLATE utf8mb4_bin: keys are
-- case-sensitive and compared byte for byte, and the *_bin collations are
-- PAD SPACE on MariaDB and on MySQL before 8.0, so 'abc' and 'abc ' would be
-- one key. 1024 bytes each covers a 255-character utf8mb4 key and a long
-- scope while the primary key stays under InnoDB's 3072-byte index limit
-- (DYNAMIC row format, the default on MariaDB >= 10.2 and MySQL >= 5.7).
--
-- Times are DATETIME(6) holding UTC: TIMESTAMP would be converted through the
-- session time_zone and ends in 2038.
--
-- recovery_point and last_error are BLOBs so any Go string round-trips
-- exactly (a utf8mb4 column rejects invalid UTF-8 in strict mode).
--
-- response_headers is JSON: native on MySQL, an alias of LONGTEXT with a
-- JSON_VALID check on MariaDB; both read back the same text.
--
-- row_version grows at every change, so a guarded UPDATE always changes the
-- row and its affected-rows count is 1 even on a connection without
-- clientFoundRows.
--
-- CHECK constraints are enforced by MariaDB >= 10.2 and MySQL >= 8.0.16
-- (older MySQL parses and ignores them).
CREATE TABLE IF NOT EXISTS idem_records (
    scope                 VARBINARY(1024) NOT NULL,
    `key`                 VARBINARY(1024) NOT NULL,
    fingerprint           VARBINARY(512)  NOT NULL,
    state                 VARCHAR(16)     NOT NULL,
    fence                 BIGINT          NOT NULL,
    lease_policy          VARCHAR(16)     NOT NULL,
    locked_until          DATETIME(6)     NOT NULL,
    recovery_point        BLOB            NOT NULL,
    response_status       SMALLINT        NULL,
    response_headers      JSON            NULL,
    response_body         LONGBLOB        NULL,
    response_body_omitted BOOLEAN         NOT NULL DEFAULT FALSE,
    last_error            BLOB            NOT NULL,
    attempts              INT             NOT NULL,
    created_at            DATETIME(6)     NOT NULL,
    updated_at            DATETIME(6)     NOT NULL,
    completed_at          DATETIME(6)     NULL,
    expires_at            DATETIME(6)     NOT NULL,
    reconcile_after       DATETIME(6)     NULL,
    reconcile_attempts    INT             NOT NULL DEFAULT 0,
    row_version           BIGINT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, `key`),
    -- sweeper: state = 'in_progress' AND lease_policy = 'unknown' AND locked_until <= now
    KEY idem_records_lease (state, lease_policy, locked_until),
    -- reaper: state IN (...) AND expires_at <= now
    KEY idem_records_expiry (state, expires_at),
    -- reconciler: state = 'unknown' AND reconcile_after <= now
    KEY idem_records_reconcile (state, reconcile_after),
    CONSTRAINT idem_records_state_chk
        CHECK (state IN ('in_progress', 'completed', 'failed_retryable', 'unknown', 'expired')),
    CONSTRAINT idem_records_policy_chk
        CHECK (lease_policy IN ('unknown', 'retry', 'resume')),
    CONSTRAINT idem_records_fence_chk CHECK (fence >= 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
