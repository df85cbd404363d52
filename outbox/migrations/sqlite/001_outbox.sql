-- idem_outbox holds one row per message, (key, kind), written in the
-- enqueuing transaction beside River's job. It outlives River's job row:
-- River deletes finished jobs after its retention periods, while the
-- downstream id recorded here is what keeps a later redelivery of the same
-- (key, kind) from calling the provider again.
--
-- Times are integer unix microseconds (UTC), as in idem's SQLite store.
CREATE TABLE idem_outbox (
    key           TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    fence         INTEGER NOT NULL,
    -- the River job currently carrying the message
    job_id        INTEGER NOT NULL,
    -- set once, by the first delivery to succeed; never overwritten
    downstream_id TEXT,
    -- River's attempt number of that delivery
    attempts      INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL,
    delivered_at  INTEGER,
    PRIMARY KEY (key, kind),
    CHECK ((downstream_id IS NULL) = (delivered_at IS NULL))
);

-- DeadLetters maps River's discarded jobs back to their messages.
CREATE INDEX idem_outbox_job_id ON idem_outbox (job_id);
