-- The replay caches of the processes on this schema (Config.ReplayCache).
--
-- A process that keeps completed records in memory registers here and
-- LISTENs for invalidations; it renews alive_until while its listening
-- connection works and stops answering from memory when it cannot. seen is
-- the last invalidation (a value of idem_cache_seq) it has applied. An
-- operator's Delete or a settlement notifies, then waits until every
-- process still alive has seen it, so that no process answers the old
-- record once the action has returned.
CREATE SEQUENCE IF NOT EXISTS idem_cache_seq;

CREATE TABLE IF NOT EXISTS idem_cache_nodes (
    node        text        PRIMARY KEY,
    seen        bigint      NOT NULL,
    alive_until timestamptz NOT NULL
);
