-- idem_outbox holds one row per message, (key, kind), written in the
-- enqueuing transaction beside River's job. It outlives River's job row:
-- River deletes finished jobs after its retention periods, while the
-- downstream id recorded here is what keeps a later redelivery of the same
-- (key, kind) from calling the provider again.
CREATE TABLE idem_outbox (
    key           text        NOT NULL,
    kind          text        NOT NULL,
    fence         bigint      NOT NULL,
    -- the River job currently carrying the message
    job_id        bigint      NOT NULL,
    -- set once, by the first delivery to succeed; never overwritten
    downstream_id text,
    -- River's attempt number of that delivery
    attempts      integer     NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    CONSTRAINT idem_outbox_pkey PRIMARY KEY (key, kind),
    CONSTRAINT idem_outbox_delivered_check CHECK
        ((downstream_id IS NULL) = (delivered_at IS NULL))
);

-- DeadLetters maps River's discarded jobs back to their messages.
CREATE INDEX idem_outbox_job_id ON idem_outbox (job_id);
