package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store"
)

// Commits a synchronous standby did not confirm.
//
// With synchronous_standby_names set, the server makes a commit wait until
// a standby confirms it, and only then answers it and lets other sessions
// see it. The wait can be cut short: by a cancel request (pgx sends one
// when a call's context ends, with its default handler as with
// pgconn.CancelRequestContextWatcherHandler; pg_cancel_backend) or by the
// backend's termination (statement_timeout does not: the server turns it
// off before the commit). The server then keeps the commit, visible to
// every session, sends a WARNING ("canceling wait for synchronous
// replication"), and answers a cancelled wait as a success: the standby
// may not have it, and a failover loses it.
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
// Other sessions see a record whose commit's wait was cancelled as they
// see any committed row, and would replay it. So each store checks that
// the standby confirms commits (standbyWatch): while it may not, a
// completed record is answered only once the standby confirmed a later
// commit.
//
// What the store cannot see: a caller's own transaction committed with
// tx.Commit (ReserveTx, CompleteTx on a pgx.Tx: its Commit returns nil
// after the WARNING; Store.Commit sees it), a pool given to New without
// WatchStandbyWaits, and a
// record read in the moment before the check notices the standby's stall
// when something other than the store's own timeout cancelled its wait
// earlier than that (see standbyWatch and docs/postgres-production.md).

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

// Commit commits tx, a transaction on a pool that watches standby waits
// (Open's, or one configured with WatchStandbyWaits), and fails with a
// retryable error naming the standby when the server cancelled the
// commit's wait for the synchronous standby: the commit happened, but a
// failover could lose it, and tx.Commit alone returns nil then. Commit the
// transactions that hold ReserveTx, CompleteTx or CheckpointTx with it
// (InTx does).
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error {
	data := tx.Conn().PgConn().CustomData()
	delete(data, standbyWaitKey) // a flag no earlier caller took
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if data[standbyWaitKey] != nil {
		delete(data, standbyWaitKey)
		return errStandbyWait
	}
	return nil
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

// DefaultStandbyCheck is how often a store checks that a synchronous
// standby confirms commits when Config.StandbyCheck is 0.
const DefaultStandbyCheck = time.Second

// standbyCheckTimeout bounds one check's wait for the standby.
const standbyCheckTimeout = 30 * time.Second

// sqlSynchronous tells whether this session's commits wait for a
// synchronous standby: a read, which writes no WAL.
const sqlSynchronous = `SELECT current_setting('synchronous_standby_names') <> ''
	AND current_setting('synchronous_commit') NOT IN ('off', 'local')`

// standbyWatches holds a store's standbyWatch, started once synchronous
// replication is seen configured (at New, and at each CheckDurability, so
// that a server made synchronous later is watched within the engine's
// durability interval) and stopped by Close.
type standbyWatches struct {
	mu     sync.Mutex
	w      atomic.Pointer[standbyWatch]
	closed bool
}

// start starts the watch unless it runs or the store is closed.
func (ws *standbyWatches) start(s *Store) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed || ws.w.Load() != nil || s.cfg.StandbyCheck < 0 {
		return
	}
	ws.w.Store(watchStandby(s, cmp.Or(s.cfg.StandbyCheck, DefaultStandbyCheck)))
}

func (ws *standbyWatches) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	if w := ws.w.Load(); w != nil {
		w.close()
	}
}

// degraded reports whether the running watch, if any, says the standby
// may have stopped confirming.
func (ws *standbyWatches) degraded() bool {
	w := ws.w.Load()
	return w != nil && w.degraded()
}

// confirm returns nil at once unless the watch is degraded, and then once
// one of its checks that began afterwards succeeded (standbyWatch.confirm).
func (ws *standbyWatches) confirm(ctx context.Context) error {
	w := ws.w.Load()
	if w == nil || !w.degraded() {
		return nil
	}
	return w.confirm(ctx)
}

// watchStandbyIfSynchronous starts the watch when the server's commits wait
// for a synchronous standby (and Config.StandbyCheck allows it). A server
// it cannot ask is asked again at the next CheckDurability.
func (s *Store) watchStandbyIfSynchronous(ctx context.Context) {
	if s.cfg.StandbyCheck < 0 || s.standby.w.Load() != nil {
		return // off, or running
	}
	var synchronous bool
	if err := s.pool.QueryRow(ctx, sqlSynchronous).Scan(&synchronous); err == nil && synchronous {
		s.standby.start(s)
	}
}

// standbyWatch checks, from this process, that a synchronous standby
// confirms commits.
//
// A commit becomes visible without the standby only when its wait for the
// standby is cancelled or terminated; the store's own calls cancel theirs
// when their context ends, which for the engine's calls is the store
// timeout (5 s by default) after they began. Every interval, while
// synchronous replication is configured, the watch commits a write that
// waits for the standby (Sync). From the moment one has waited longer than
// an interval, or failed, until one succeeds, the store is degraded: a
// completed record it returns waits first until a check that began after
// it was read succeeded (its commit came later, so the standby has the
// record then), so that no process replays an answer its standby may not
// have. A standby that stops confirming is seen within two intervals, before
// the store timeout of a commit that began waiting with it has passed; a
// store timeout shorter than two intervals loses that margin.
//
// The price: while the standby does not confirm, no completed record is
// replayed (Reserve and Get fail when their context ends), as no new
// record is committed.
type standbyWatch struct {
	interval time.Duration
	stop     context.CancelFunc
	done     chan struct{}

	mu sync.Mutex
	// since is the start of the Sync in flight, zero when none; failed
	// says the last Sync failed. Together they say degraded.
	since  time.Time
	failed bool
	// What confirm waits for: begun counts the checks begun, ok is the
	// number (in that count) of the last one that succeeded, failures
	// counts those that did not confirm anything, and ended is closed,
	// then replaced, whenever one ends.
	begun    uint64
	ok       uint64
	failures uint64
	ended    chan struct{}
}

func watchStandby(s *Store, interval time.Duration) *standbyWatch {
	ctx, stop := context.WithCancel(context.Background())
	w := &standbyWatch{interval: interval, stop: stop, done: make(chan struct{}), ended: make(chan struct{})}
	go w.run(ctx, s)
	return w
}

func (w *standbyWatch) run(ctx context.Context, s *Store) {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.check(ctx, s)
	}
}

// check runs one check: a read of the settings, then, while commits wait
// for a standby, a Sync.
func (w *standbyWatch) check(ctx context.Context, s *Store) {
	w.mu.Lock()
	w.begun++
	n := w.begun
	w.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, w.interval)
	var synchronous bool
	err := s.pool.QueryRow(rctx, sqlSynchronous).Scan(&synchronous)
	cancel()
	if err != nil || !synchronous {
		// Unreachable (nothing commits either), or nothing to wait for:
		// not degraded. A record read earlier is not confirmed by it,
		// though: it may have been read on a server this one replaced.
		w.end(n, false, false)
		return
	}
	w.mu.Lock()
	w.since = time.Now()
	w.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, standbyCheckTimeout)
	err = s.Sync(sctx)
	cancel()
	w.end(n, err == nil, err != nil && ctx.Err() == nil)
}

// end records the end of check n, whether it confirmed the standby and
// whether its Sync failed, and wakes those waiting in confirm.
func (w *standbyWatch) end(n uint64, ok, failed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.since, w.failed = time.Time{}, failed
	if ok {
		w.ok = n
	} else {
		w.failures++
	}
	close(w.ended)
	w.ended = make(chan struct{})
}

// errStandbyCheckFailed ends confirm when a check failed after it was
// called: the connection may have moved to another server (a failover),
// where a later check proves nothing of what the caller read before.
var errStandbyCheckFailed = errors.New("the check of the standby failed meanwhile (the server may have changed)")

// confirm returns once a check that began after it was called succeeded,
// with no check failing in between: that check's commit came after every
// write the caller had read, on the same server, so the standby then has
// them. It fails when ctx ends first, or a check fails. Those waiting
// share the checks, so a stalled standby costs the database no more than
// the watch's own commit.
func (w *standbyWatch) confirm(ctx context.Context) error {
	w.mu.Lock()
	target, failures := w.begun+1, w.failures
	w.mu.Unlock()
	for {
		w.mu.Lock()
		ok, failed, ended := w.ok >= target, w.failures != failures, w.ended
		w.mu.Unlock()
		switch {
		case failed:
			return errStandbyCheckFailed
		case ok:
			return nil
		}
		select {
		case <-ended:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// degraded reports whether the standby may have stopped confirming.
func (w *standbyWatch) degraded() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed || (!w.since.IsZero() && time.Since(w.since) > w.interval)
}

func (w *standbyWatch) close() {
	w.stop()
	<-w.done
}

// errUnconfirmedReplay fails a read of a completed record while the
// standby may not have it.
var errUnconfirmedReplay = errors.New("a synchronous standby stopped confirming commits, and it did not confirm this completed record in time: " +
	"it is not answered until the standby does")

// confirmRecord holds a completed record, while the standby watch says
// the standby may have stopped confirming, until one of the watch's checks
// confirmed it (see standbyWatch).
func (s *Store) confirmRecord(ctx context.Context, rec *store.Record) error {
	if rec.State != store.StateCompleted {
		return nil
	}
	if err := s.standby.confirm(ctx); err != nil {
		return store.Retryable(fmt.Errorf("%w: %w", errUnconfirmedReplay, err))
	}
	return nil
}

// confirmed is what a reservation returns, once an existing completed
// record it found is confirmed (confirmRecord).
func (s *Store) confirmed(ctx context.Context, res store.ReserveResult, err error) (store.ReserveResult, error) {
	if err != nil || res.Outcome != store.Existing {
		return res, err
	}
	if err := s.confirmRecord(ctx, &res.Record); err != nil {
		return store.ReserveResult{}, fmt.Errorf("idem/postgres: reserve: %w", err)
	}
	return res, nil
}
