package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store"
)

// Commits a synchronous standby did not confirm.
//
// With synchronous_standby_names set, the server makes a commit wait until
// a standby confirms it, and only then answers it and lets other sessions
// see it. The wait can be cut short: by a cancel request (pg_cancel_backend,
// a statement_timeout, pgconn.CancelRequestContextWatcherHandler when a
// call's context ends) or by the backend's termination. The server then
// keeps the commit, visible to every session, sends a WARNING ("canceling
// wait for synchronous replication"), and answers a cancelled wait as a
// success: the standby may not have it, and a failover loses it.
//
// The pools Open makes watch for that WARNING (WatchStandbyWaits), and
// every write of the store's own (the transitions, alone or batched, the
// operator's Delete, Resolve and Defer, the queue's and the sweeper's
// statements, InTx's commit) fails with a retryable error naming the
// standby when its commit got one: the engine then treats the write as
// one whose answer was lost. A terminated backend loses its connection,
// which is retryable already. A write found by a later read (the engine
// checking whether a lost Complete landed) is confirmed by Sync, which
// commits a write of its own and so waits for the standby to have
// everything before it.
//
// What the store cannot see: a caller's own transaction (ReserveTx,
// CompleteTx on a pgx.Tx the caller commits; its Commit returns nil after
// the WARNING), and a pool given to New without WatchStandbyWaits. Records
// other sessions read are visible once committed, so a replay of a record
// whose commit's wait was cancelled may still be served before the
// standby has it; do not cancel waits for synchronous replication (see
// docs/postgres-production.md).

// standbyWaitKey marks, in a connection's pgconn.PgConn.CustomData, a
// commit whose wait for a synchronous standby the server cancelled.
const standbyWaitKey = "idem/postgres: standby wait cancelled"

// syncRepRoutine is the server function that reports a cancelled wait for
// synchronous replication (the notice's Routine field, which unlike its
// message is not translated).
const syncRepRoutine = "SyncRepWaitForLSN"

// errStandbyWait fails a write whose commit's wait for the synchronous
// standby was cancelled.
var errStandbyWait = store.Retryable(errors.New("the server committed without the synchronous standby's " +
	"confirmation (its wait for the standby was cancelled): a failover could lose the write"))

// WatchStandbyWaits makes the connections of a pool configured with cfg
// tell the store when the server cancelled a commit's wait for a
// synchronous standby (see Store.Sync). The pools Open makes have it; call
// it on the config of a pool you give to New. It keeps a notice handler
// already set, and calls it first.
func WatchStandbyWaits(cfg *pgxpool.Config) {
	next := cfg.ConnConfig.OnNotice
	cfg.ConnConfig.OnNotice = func(pc *pgconn.PgConn, n *pgconn.Notice) {
		if next != nil {
			next(pc, n)
		}
		if n.Routine == syncRepRoutine && (n.SeverityUnlocalized == "WARNING" || n.Severity == "WARNING") {
			pc.CustomData()[standbyWaitKey] = true
		}
	}
}

// standbyWaitCancelled reports, and forgets, whether a commit on c had its
// wait for the standby cancelled since the last call.
func standbyWaitCancelled(c *pgxpool.Conn) bool {
	data := c.Conn().PgConn().CustomData()
	if data[standbyWaitKey] == nil {
		return false
	}
	delete(data, standbyWaitKey)
	return true
}

// acknowledged runs f, one or more statements that write, on q. On the
// store's pool f gets one connection of it, and an f that succeeded fails
// with errStandbyWait when the server cancelled the wait of one of its
// commits for the synchronous standby. In a caller's transaction f runs
// on it unchanged.
func (s *Store) acknowledged(ctx context.Context, q querier, f func(querier) error) error {
	if q != querier(s.pool) {
		return f(q)
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	err = f(c)
	if standbyWaitCancelled(c) && err == nil {
		err = errStandbyWait
	}
	return err
}

// inTx runs fn in a transaction on a connection of the store's pool, as
// pgx.BeginFunc does, and fails as acknowledged does when the commit's
// wait for the synchronous standby was cancelled.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return s.acknowledged(ctx, s.pool, func(q querier) error {
		return pgx.BeginFunc(ctx, q.(*pgxpool.Conn), fn)
	})
}

var _ store.Syncer = (*Store)(nil)

// sqlSync writes a transactional logical message: a write no table
// holds, which gives its transaction an ID and a WAL record, so that its
// commit waits for the synchronous standby (a transaction that writes no
// WAL commits without waiting). Any role may run it, at any wal_level.
const sqlSync = `SELECT pg_logical_emit_message(true, 'idem', '')`

// Sync implements store.Syncer: it commits a write of its own, which the
// server confirms only once the synchronous standby (when there is one)
// has everything written before it. It fails while the standby has not
// confirmed when ctx ends, and with a retryable error naming the standby
// when the wait was cancelled. Without synchronous standbys it costs one
// commit.
func (s *Store) Sync(ctx context.Context) error {
	err := s.acknowledged(ctx, s.pool, func(q querier) error {
		_, err := q.Exec(ctx, sqlSync)
		return err
	})
	if err != nil {
		return wrap(ctx, "sync", err)
	}
	return nil
}
