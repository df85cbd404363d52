// Package postgres is the PostgreSQL store of idem, the reference production
// store, built on pgx v5 and pgxpool.
//
// # Round trips
//
// A new request costs one round trip to reserve and one to complete; a
// replay costs one and writes nothing (no new row version, no row lock).
// Reserve is a single statement (a data-modifying CTE: an INSERT ... ON
// CONFLICT DO NOTHING, a read of the existing row, and a guarded UPDATE for
// the transitions that need one); see sqlReserve in queries.go. The
// statement runs a second time only when it raced a concurrent transaction
// on the same key and its snapshot could not see that transaction's row.
//
// These counts are for a warm connection, which is the steady state of a
// busy pool: pgx prepares each statement once per connection (one extra
// round trip on its first use), and pgxpool by default pings a connection
// that sat idle for a second before handing it out (see
// pgxpool.Config.ShouldPing; pass your own pool to [New] to change it).
//
// # Group commit and pool size
//
// Reserve and the lease-holder updates share commits under load. A call that
// finds one of Config.MaxBatches slots free (DefaultMaxBatches, 1) runs its
// statement alone, at once. Calls that arrive while every slot is busy
// queue, and leave together when a slot returns, as one pipeline in one
// implicit transaction: one round trip per call still, but one commit and
// one WAL flush for the whole batch. The batch's Reserves go as one
// multi-row statement (one INSERT ... SELECT FROM unnest(...) for the keys
// no row holds, returning each call's record), its Completes as one
// multi-row UPDATE; a key repeated in the batch, and the other transitions,
// follow as single statements, so every call gets what it would have got
// had the calls run one after the other (of two Reserves of a new key, the
// first creates it and the second finds it in progress). A Reserve whose
// record needs a rewrite (a released, expired or abandoned record) runs its
// single statement after the batch: a second round trip, only for those.
// No call ever waits for a timer, so a lone request's latency is unchanged.
// The statements of a batch commit or roll back together: a statement error
// rolls the batch back and each of its calls then runs alone, so only the
// faulty call sees the error. Calls on the Tx forms never join a batch.
// The calls of a batch wait for one another, so a batch that waits for a
// row lock (a key that a caller's open transaction holds through the Tx
// forms) gives up after 100 ms (lock_timeout, set for the batch alone) and
// its calls run alone; a lone call that waits for a lock keeps its slot,
// and calls queued behind it for 50 ms get extra slots (see
// [DefaultMaxBatches]).
//
// [Open] sizes the pool to Config.MaxConns, or to the URL's pool_max_conns,
// or to [DefaultMaxConns] (32), not to pgxpool's max(4, CPUs): with 16
// requests in flight, 4 connections would queue the rest before the
// batches could form. Batched calls hold at most MaxBatches connections;
// the rest serve Get, maintenance and reruns. Size the pool of [New] the
// same way, and mind max_connections across all instances.
//
// # Calls whose context ends
//
// A call whose context ends while its statement runs returns the context's
// error, and its statement stops on the server too: pgx interrupts the
// connection, sends PostgreSQL a cancel request and closes the connection
// (the pool opens another when it needs one). The server rolls back what
// the statement did, so a call that gave up does not go on waiting for a
// row lock, hold the sweep's lock, or commit later. Behind pgbouncer the
// request goes to the pooler, which forwards it to the server connection
// that runs the statement. The pools of [Open] keep this, pgx's default.
//
// The statements of a batch (see below) run under a context of the batch,
// which ends at the latest deadline of its calls and which no call's
// cancellation ends: a caller that gives up does not stop the other calls'
// statements. Its own statement still runs in the batch, and its outcome
// is unknown to that caller, as for any statement abandoned in flight.
//
// A pool given to [New] is the caller's: the store changes none of its
// settings. Keep pgx's default there too, or choose a
// pgconn.Config.BuildContextWatcherHandler that still stops the statement
// on the server. pgconn.CancelRequestContextWatcherHandler sends the cancel
// request and keeps the connection; the store then reports the context's
// error all the same, and its replay cache's own connection keeps pgx's
// default (its waits for notifications end by their context every second,
// which must not wait for a cancel request's deadline). Do not use that
// handler through pgbouncer 1.18 (Debian 12's): the handler closes the
// cancel request's connection as soon as the statement returns, often
// before pgbouncer has finished with the request, and pgbouncer 1.18 then
// exits with a fatal error (it did within four cancellations, in each of
// three runs). Later pgbouncer releases fixed that crash; make sure yours
// has before you pair the two. A delay before the handler acts (the DeadlineDelay
// of pgx's default handler, the CancelRequestDelay of the other) holds the
// call, and its statement on the server, that much longer.
//
// # Transactions
//
// [Store.ReserveTx], [Store.CompleteTx] and [Store.CheckpointTx] run the same
// statements on the caller's [pgx.Tx], so a business write and the key's
// completion commit together.
//
// # Schema
//
// The table idem_records and the bookkeeping table idem_migrations live in
// Config.Schema, or in the first schema of the connection's search_path.
// Migrations are embedded and applied by [Open] and [New] unless
// Config.SkipMigrate is set; see [Store.Migrate].
//
// # Plans and autovacuum
//
// pgx prepares each statement once per connection, and PostgreSQL settles
// on one generic plan for it after a few runs, made with the table's
// statistics of that moment; the plan is made again only when the
// statistics change (ANALYZE, which autovacuum runs as the table grows).
// The statements find records by key, which every plan does through an
// index for a table that was never analyzed, as a new one is. The
// multi-row reserve reads each record through a LATERAL subquery that
// allows nothing but that probe (a join there was planned as a scan of the
// whole table). A table analyzed while empty, though, can make even a single
// statement's plan a sequential scan, which is cheaper on an empty table;
// keep autovacuum on (the default) so that the growing table is analyzed
// again, or run ANALYZE idem_records after loading it. Connections live at
// most an hour (pgxpool's MaxConnLifetime), so every plan is made anew at
// least that often.
package postgres

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/migrate"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var (
	_ store.Store           = (*Store)(nil)
	_ store.TxStore[pgx.Tx] = (*Store)(nil)
	_ querier               = (*pgxpool.Pool)(nil)
	_ querier               = (pgx.Tx)(nil)
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Config configures a Store.
type Config struct {
	// Clock replaces the database clock for every expiry decision. Defaults
	// to nil: the server's statement_timestamp(), one clock for every
	// instance, immune to skew between application servers. Tests set it
	// to move time without sleeping.
	Clock store.Clock
	// Schema holds the store's tables. Defaults to "": the connection's
	// search_path decides (the first schema in it that exists).
	Schema string
	// SkipMigrate leaves the schema alone at Open/New, for deployments that
	// run migrations as a separate step (Store.Migrate, `idem migrate`).
	// Defaults to false: pending migrations are applied.
	SkipMigrate bool
	// MaxConns is the size of the pool Open creates (New leaves the
	// caller's pool alone). Defaults to 0: the URL's pool_max_conns when it
	// has one, else DefaultMaxConns. pgxpool's own default, max(4, number of
	// CPUs), would make every request beyond the fourth wait for a
	// connection.
	MaxConns int32
	// MaxBatches is how many group commits (see DefaultMaxBatches) may be
	// on their way to the database at once. A Reserve or lease-holder
	// update that finds one free runs alone at once; one that finds none
	// waits for the next batch, which leaves as soon as a batch in flight
	// returns. Fewer slots make larger batches (fewer commits) under load;
	// each slot holds one connection of the pool. Defaults to 0:
	// DefaultMaxBatches. Negative turns batching off: every call runs its
	// own statement on its own connection.
	MaxBatches int
	// ForceBatches sends every Reserve and lease-holder update through the
	// batched path, even a call that finds a slot free and rides alone,
	// and sends a batch's Reserves and Completes as the multi-row
	// statements even when there is one of them. It is slower and exists
	// for tests: the store suite runs once with it, so that the batched
	// statements meet every rule that the single ones meet. Defaults to
	// false. Ignored when MaxBatches is negative.
	ForceBatches bool
	// TenantCap makes the store count each tenant's active records, which
	// store.ReserveParams.MaxActive (idem.Config.TenantMaxActive) needs:
	// every active record then keeps its tenant in an index, and the
	// transitions out of the active states, completion among them, rewrite
	// that entry, which makes them ordinary updates instead of heap-only
	// ones (see docs/postgres-production.md). Every store sharing a schema
	// must agree on it. Defaults to false: a Reserve with a positive
	// MaxActive fails with store.ErrCapUnsupported, and the engine refuses
	// a TenantMaxActive on this store at start.
	TenantCap bool
	// ReplayCache, when positive, keeps completed records in memory, up to
	// that many bytes, and answers their replays without a round trip
	// (least recently used records go first). An operator's Delete and a
	// settlement (Resolve), from any store on the schema (`idem delete`
	// included), return only once every process's cache has dropped the
	// record, so no replay of the old answer follows them: each cache
	// LISTENs on a connection of its own and stops answering from memory
	// within 3 seconds of losing it. Defaults to 0: no cache.
	ReplayCache int64
	// ListenURL is the connection the replay cache LISTENs on, for a pool
	// that goes through a pooler in transaction mode (where LISTEN does not
	// hold): a direct connection to the same database. Defaults to "": the
	// pool's own connection settings; Open fails when they reach a
	// pooler.
	ListenURL string
	// Partitions, when positive, keeps the records in a table partitioned
	// by retention, one partition per this much time (whole seconds; a day
	// suits a TTL of a day), and makes Reap drop a partition whole once its
	// range has passed, instead of deleting its records one by one (see
	// partition.go and docs/postgres-production.md). It takes a table made
	// so: Open and New make it in a schema without idem_records, and refuse
	// a plain table (a table cannot be partitioned in place). A store
	// opened without it on a partitioned table runs as partitioned, but for
	// one with SkipMigrate that could not reach the server at Open, whose
	// reservations then fail: set it on every process of such a schema.
	// Defaults to 0: the plain table.
	Partitions time.Duration
	// PartitionsAhead is how many partitions Reap keeps made after the one
	// holding the present; a record whose retention ends past them waits
	// in the DEFAULT partition until its partition is made. Defaults to 0:
	// DefaultPartitionsAhead. Ignored without Partitions.
	PartitionsAhead int
	// StandbyCheck is how often the store checks that a synchronous
	// standby confirms commits, once it has seen synchronous replication
	// configured (at New, or at a CheckDurability, which the engine runs
	// every idem.Config.DurabilityInterval; see "Commits a synchronous
	// standby did not confirm" in standby.go). While one check has waited
	// longer than this, or the last one failed, a completed record is
	// answered (Reserve, Get) only once a check that began after it was
	// read succeeded. Defaults to 0: DefaultStandbyCheck. Negative turns
	// the check off.
	StandbyCheck time.Duration
}

// DefaultMaxConns is the pool size Open uses when neither Config.MaxConns
// nor the URL's pool_max_conns sets one. Batched calls use at most
// Config.MaxBatches connections whatever the load; the rest serve Get,
// maintenance and the statements that run alone after a rolled-back batch.
const DefaultMaxConns = 32

// Store is a store.Store on PostgreSQL. It is safe for concurrent use.
type Store struct {
	pool      *pgxpool.Pool
	ownsPool  bool
	cfg       Config
	cache     *replayCache // nil: Config.ReplayCache off
	q         queries
	closed    atomic.Bool
	reserveRe atomic.Int64 // Reserve statements run again after a race
	batch     *batcher     // nil: batching off
	standby   standbyWatches
}

// querier is what the transitions need; *pgxpool.Pool and pgx.Tx both have
// it, so the Tx forms share one implementation with the pool forms.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Open connects to the database at url (a libpq URL or keyword/value
// string, as pgxpool.ParseConfig accepts) and returns a Store that owns the
// pool: Close closes it.
func Open(ctx context.Context, url string, cfg Config) (*Store, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("idem/postgres: open: %w", err)
	}
	switch {
	case cfg.MaxConns < 0:
		return nil, errors.Join(store.ErrInvalidParams, errors.New("idem/postgres: MaxConns must not be negative"))
	case cfg.MaxConns > 0:
		pcfg.MaxConns = cfg.MaxConns
	case !strings.Contains(url, "pool_max_conns"):
		pcfg.MaxConns = DefaultMaxConns
	}
	WatchStandbyWaits(pcfg)
	if err := choosePoolMode(ctx, url, pcfg); err != nil {
		return nil, wrap(ctx, "open", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("idem/postgres: open: %w", err)
	}
	s, err := New(ctx, pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownsPool = true
	return s, nil
}

// New returns a Store on an existing pool. The caller keeps ownership of
// the pool: Close does not close it, and New changes none of its settings
// (see "Calls whose context ends" in the package documentation for the
// one that decides what a timed-out statement does on the server). Call
// WatchStandbyWaits on the pool's config before making it, so that the
// store sees commits a synchronous standby did not confirm (see Sync).
func New(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.Join(store.ErrInvalidParams, errors.New("idem/postgres: nil pool"))
	}
	if cfg.ReplayCache < 0 {
		return nil, errors.Join(store.ErrInvalidParams, errors.New("idem/postgres: ReplayCache must not be negative"))
	}
	if err := checkPartitions(&cfg); err != nil {
		return nil, err
	}
	if err := checkPoolMode(ctx, pool, cfg.SkipMigrate); err != nil {
		return nil, err
	}
	s := &Store{pool: pool, cfg: cfg, q: newQueries(cfg.Schema, cfg.TenantCap, cfg.Partitions > 0)}
	if cfg.MaxBatches >= 0 {
		s.batch = newBatcher(s, cmp.Or(cfg.MaxBatches, DefaultMaxBatches), cfg.ForceBatches)
	}
	if !cfg.SkipMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.checkTableKind(ctx); err != nil {
		return nil, err
	}
	if !cfg.SkipMigrate {
		if err := s.EnsurePartitions(ctx); err != nil && !lockTimedOut(err) {
			// A table busy past the lock's timeout does not stop a
			// process from starting: the DEFAULT partition takes what no
			// partition covers, and the reaper makes them later.
			return nil, err
		}
	}
	if cfg.ReplayCache > 0 {
		if err := s.startCache(ctx); err != nil {
			return nil, err
		}
	}
	s.watchStandbyIfSynchronous(ctx)
	return s, nil
}

// migrationTables is the store's version table, idem_migrations.
var migrationTables = migrate.Tables{Create: sqlMigrateTable, Applied: sqlMigrateApplied, Record: sqlMigrateRecord}

// Migrate applies the pending embedded migrations in one transaction under
// a transaction-scoped advisory lock, so concurrent processes starting
// together apply each migration once. Applied versions are recorded in
// idem_migrations. Calling it again is a no-op.
func (s *Store) Migrate(ctx context.Context) error {
	all, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return fmt.Errorf("idem/postgres: migrate: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if s.cfg.Schema != "" {
			path := pgx.Identifier{s.cfg.Schema}.Sanitize()
			if _, err := tx.Exec(ctx, sqlMigrateSearchPath, path); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, sqlMigrateLock); err != nil {
			return err
		}
		if s.partitioned() {
			if err := createPartitioned(ctx, tx, all); err != nil {
				return err
			}
		}
		return migrate.ApplyIn(ctx, tx, all, migrationTables)
	})
	if err != nil {
		return wrap(ctx, "migrate", err)
	}
	return nil
}

// Pool returns the pool the store runs on, e.g. to begin the transactions
// passed to the Tx forms.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// MaxBatches reports how many group commits the store may have in flight
// (Config.MaxBatches, or its default); 0 when batching is off.
func (s *Store) MaxBatches() int {
	if s.batch == nil {
		return 0
	}
	return s.batch.slots
}

// now is the clock parameter of every statement: NULL selects the database
// clock.
func (s *Store) now() any {
	if s.cfg.Clock == nil {
		return nil
	}
	return s.cfg.Clock().UTC()
}

// Reserve implements store.Store. With Config.ReplayCache, a replay of a
// completed record in memory is answered from there.
func (s *Store) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	c := s.cache
	if c == nil {
		res, err := s.reserve(ctx, s.pool, p)
		return s.confirmed(ctx, res, err)
	}
	// The refusals come first: memory answers only what the statement
	// would.
	if err := s.checkReserve(&p); err != nil {
		return store.ReserveResult{}, err
	}
	rec, epoch, ok := c.lookup(&p, s.clockNow())
	if ok {
		return s.confirmed(ctx, store.ReserveResult{Outcome: store.Existing, Record: rec}, nil)
	}
	res, err := s.reserveChecked(ctx, s.pool, p)
	if err == nil && res.Outcome == store.Existing {
		c.keep(&res.Record, epoch)
	}
	return s.confirmed(ctx, res, err)
}

// clockNow is the store's clock in this process: Config.Clock, or the
// process clock (the replay cache's expiry check allows for the distance
// to the database's).
func (s *Store) clockNow() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock()
	}
	return time.Now()
}

// ReserveTx is Reserve inside the caller's transaction: the record is
// created (or taken) only if tx commits. Under REPEATABLE READ or
// SERIALIZABLE a race on the key surfaces as a serialization failure from
// the database; the caller retries its transaction. A reservation under a
// tenant cap (MaxActive), and any on a partitioned table, refuses
// REPEATABLE READ, whose snapshot predates the lock it counts or reads
// under.
func (s *Store) ReserveTx(ctx context.Context, tx pgx.Tx, p store.ReserveParams) (store.ReserveResult, error) {
	res, err := s.reserve(ctx, tx, p)
	return s.confirmed(ctx, res, err)
}

// maxReserveRuns bounds the statement runs of one Reserve. A rerun needs a
// concurrent transaction to have committed a change to the same key between
// this run's snapshot and its write; after a few, something keeps churning
// the key and failing closed is safer than looping.
const maxReserveRuns = 5

// checkReserve refuses what no reservation statement may run: invalid
// parameters, a tenant cap on a table without one.
func (s *Store) checkReserve(p *store.ReserveParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if p.MaxActive > 0 && !s.cfg.TenantCap {
		return s.capUnsupported("reserve")
	}
	return nil
}

func (s *Store) reserve(ctx context.Context, q querier, p store.ReserveParams) (store.ReserveResult, error) {
	if err := s.checkReserve(&p); err != nil {
		return store.ReserveResult{}, err
	}
	return s.reserveChecked(ctx, q, p)
}

// reserveChecked is reserve once checkReserve passed.
func (s *Store) reserveChecked(ctx context.Context, q querier, p store.ReserveParams) (store.ReserveResult, error) {
	refusals := 0
	for run := 0; run < maxReserveRuns; run++ {
		if run > 0 {
			s.reserveRe.Add(1)
		}
		args := []any{p.Scope, p.Key, p.Fingerprint, storekit.Micros(p.Lease), storekit.Micros(p.TTL), string(p.LeasePolicy), s.now(), p.Tenant, p.Owner}
		var op *batchOp
		if p.MaxActive > 0 {
			var refused bool
			if op, refused = s.reserveCapped(ctx, q, &p, args); refused {
				over, err := s.atCap(ctx, q, &p)
				switch {
				case err != nil:
					return store.ReserveResult{}, wrap(ctx, "reserve", err)
				case over && refusals > 0:
					return store.ReserveResult{}, store.ErrOverCap
				case over:
					// Once more: a record of this very key committed
					// meanwhile is answered, not refused.
					refusals++
				}
				continue
			}
		} else {
			op = s.run(ctx, q, true, s.q.reserve, args)
		}
		action, rec, err := op.action, op.rec, op.err
		if errors.Is(err, pgx.ErrNoRows) {
			continue // insert conflicted with a row newer than the snapshot
		}
		if q == querier(s.pool) && movedRow(err) {
			continue // the row moved to another partition while this statement waited for it
		}
		if err != nil {
			return store.ReserveResult{}, wrap(ctx, "reserve", err)
		}
		switch action {
		case "created", "replace":
			return store.ReserveResult{Outcome: store.Created, Record: rec}, nil
		case "reclaim":
			return store.ReserveResult{Outcome: store.Reclaimed, Record: rec}, nil
		case "takeover":
			return store.ReserveResult{Outcome: store.TakenOver, Record: rec}, nil
		case "existing", "to_unknown":
			return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
		case "stale":
			continue // a concurrent transition won; look again
		default:
			return store.ReserveResult{}, fmt.Errorf("idem/postgres: reserve: unexpected action %q", action)
		}
	}
	return store.ReserveResult{}, fmt.Errorf("idem/postgres: reserve: key %q kept changing under %d attempts", p.Key, maxReserveRuns)
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	return s.complete(ctx, s.pool, p)
}

// CompleteTx is Complete inside the caller's transaction: the response is
// stored only if tx commits, together with the caller's business writes.
// The row stays locked by tx until it ends.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p store.CompleteParams) error {
	return s.complete(ctx, tx, p)
}

func (s *Store) complete(ctx context.Context, q querier, p store.CompleteParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	headers, err := encodeHeader(p.Response.Header)
	if err != nil {
		return err
	}
	body := p.Response.Body
	if p.Response.BodyOmitted {
		body = nil
	}
	return s.fenced(ctx, q, "complete", s.q.complete, p.FenceParams,
		p.Response.Status, headers, body, p.Response.BodyOmitted, storekit.Micros(p.TTL))
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return s.fenced(ctx, s.pool, "release", s.q.release, p.FenceParams, p.Error)
}

// MarkUnknown implements store.Store.
func (s *Store) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	req, err := storekit.EncodeRequest(p.Request)
	if err != nil {
		return err
	}
	return s.fenced(ctx, s.pool, "mark unknown", s.q.markUnknown, p.FenceParams, p.Error, req)
}

// Checkpoint implements store.Store.
func (s *Store) Checkpoint(ctx context.Context, p store.CheckpointParams) error {
	return s.checkpoint(ctx, s.pool, p)
}

// CheckpointTx is Checkpoint inside the caller's transaction, so a phase's
// writes and its recovery point commit together.
func (s *Store) CheckpointTx(ctx context.Context, tx pgx.Tx, p store.CheckpointParams) error {
	return s.checkpoint(ctx, tx, p)
}

func (s *Store) checkpoint(ctx context.Context, q querier, p store.CheckpointParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return s.fenced(ctx, q, "checkpoint", s.q.checkpoint, p.FenceParams, p.RecoveryPoint)
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return s.fenced(ctx, s.pool, "extend", s.q.extend, p.FenceParams, storekit.Micros(p.Lease))
}

// fenced runs one of the lease-holder UPDATEs ($1 scope, $2 key, $3 fence,
// $4 now, then extra) and turns "no row matched" into ErrLeaseLost.
func (s *Store) fenced(ctx context.Context, q querier, op, sql string, f store.FenceParams, extra ...any) error {
	args := append([]any{f.Scope, f.Key, f.Fence, s.now()}, extra...)
	r := s.run(ctx, q, false, sql, args)
	for run := 1; run < maxReserveRuns && q == querier(s.pool) && movedRow(r.err); run++ {
		r = s.run(ctx, q, false, sql, args) // guarded by the fence: safe to run again
	}
	if r.err != nil {
		return wrap(ctx, op, r.err)
	}
	if r.tag.RowsAffected() == 0 {
		return fmt.Errorf("idem/postgres: %s: %w", op, store.ErrLeaseLost)
	}
	return nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := store.CheckID(scope, key); err != nil {
		return store.Record{}, err
	}
	var rec store.Record
	err := scanPending(s.pool.QueryRow(ctx, s.q.get, scope, key), &rec)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, fmt.Errorf("idem/postgres: get: %w", store.ErrNotFound)
	}
	if err != nil {
		return store.Record{}, wrap(ctx, "get", err)
	}
	if err := s.confirmRecord(ctx, &rec); err != nil {
		return store.Record{}, fmt.Errorf("idem/postgres: get: %w", err)
	}
	return rec, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, p store.DeleteParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	var (
		deleted bool
		state   *string
		fence   *int64
	)
	if err := s.acknowledged(ctx, s.pool, func(q querier) error {
		return q.QueryRow(ctx, s.q.delete, p.Scope, p.Key, p.Fence).Scan(&deleted, &state, &fence)
	}); err != nil {
		return wrap(ctx, "delete", err)
	}
	if !deleted && state == nil {
		// Perhaps deleted by an earlier call whose invalidation failed
		// (it returned an error, and this is its retry): the caches are
		// told again, or they could replay the record until it expires.
		if err := s.invalidate(ctx, p.Scope, p.Key); err != nil {
			return err
		}
	}
	if err := guardedOutcome("delete", deleted, state, fence, p.Fence); err != nil {
		return err
	}
	return s.invalidate(ctx, p.Scope, p.Key)
}

// SweepExpiredLeases implements store.Store.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	// One pipeline, one implicit transaction: the lock, then the sweep
	// in a snapshot taken once the lock is held.
	recs, err := s.queryIndexed(ctx, s.q.sweepLock, s.q.sweep,
		[]any{p.Limit, s.now(), storekit.Micros(p.Grace), sweepWalk}, collectRecords)
	if err != nil {
		return nil, wrap(ctx, "sweep", err)
	}
	return recs, nil
}

// Reap implements store.Store. Terminal records go first; abandoned ones
// share what is left of p.Limit. Each batch is its own short statement, so
// no lock outlives one batch.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReapResult{}, err
	}
	headers, err := encodeHeader(p.Abandoned.Header)
	if err != nil {
		return store.ReapResult{}, err
	}
	body := p.Abandoned.Body
	if p.Abandoned.BodyOmitted {
		body = nil
	}
	// The abandon statement's parameters from $3 on.
	abandon := []any{p.Abandoned.Status, headers, body, p.Abandoned.BodyOmitted, storekit.Micros(p.AbandonedTTL), storekit.Micros(p.Grace)}
	var res store.ReapResult
	if s.partitioned() {
		res, err = s.reapPartitioned(ctx, p, abandon)
	} else {
		res, err = s.reapRows(ctx, p, s.now(), abandon)
	}
	if err != nil {
		return res, wrap(ctx, "reap", err)
	}
	return res, nil
}

// reapRows is Reap record by record: up to p.Limit terminal records past
// expiry deleted (or soft-expired), then abandoned records in what is
// left. now is the statements' clock parameter.
func (s *Store) reapRows(ctx context.Context, p store.ReapParams, now any, abandon []any) (store.ReapResult, error) {
	var res store.ReapResult
	sql := s.q.reapDelete
	if p.Soft {
		sql = s.q.reapSoft
	}
	n, err := s.execIndexed(ctx, sql, p.Limit, now)
	if err != nil {
		return res, err
	}
	res.Deleted = int(n)
	left := p.Limit - res.Deleted
	if left <= 0 {
		return res, nil
	}
	n, err = s.execIndexed(ctx, s.q.reapAbandon, append([]any{left, now}, abandon...)...)
	if err != nil {
		return res, err
	}
	res.Abandoned = int(n)
	return res, nil
}

// ListUnknown implements store.Store.
func (s *Store) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	recs, err := s.queryIndexed(ctx, sqlNoSeqScan, s.q.listUnknown, []any{p.DueOnly, p.Limit, s.now()}, collectRecords)
	if err != nil {
		return nil, wrap(ctx, "list unknown", err)
	}
	return recs, nil
}

// Resolve implements store.Store.
func (s *Store) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	var (
		status   *int
		headers  pgtype.Text
		body     []byte
		omitted  bool
		err      error
		resolved bool
		state    *string
		fence    *int64
	)
	if p.To == store.StateCompleted {
		status = &p.Response.Status
		if headers, err = encodeHeader(p.Response.Header); err != nil {
			return err
		}
		omitted = p.Response.BodyOmitted
		if !omitted {
			body = p.Response.Body
		}
	}
	err = s.acknowledged(ctx, s.pool, func(q querier) error {
		return q.QueryRow(ctx, s.q.resolve, p.Scope, p.Key, s.now(),
			string(p.To), status, headers, body, omitted, storekit.Micros(p.TTL), p.Fence).Scan(&resolved, &state, &fence)
	})
	if err != nil {
		return wrap(ctx, "resolve", err)
	}
	if err := guardedOutcome("resolve", resolved, state, fence, p.Fence); err != nil {
		return err
	}
	// The settled answer is new: no cache may hold an older one.
	return s.invalidate(ctx, p.Scope, p.Key)
}

// Defer implements store.Store.
func (s *Store) Defer(ctx context.Context, p store.DeferParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	var (
		deferred bool
		state    *string
		fence    *int64
	)
	if err := s.acknowledged(ctx, s.pool, func(q querier) error {
		if p.DeadLetter {
			return q.QueryRow(ctx, s.q.deadLetter, p.Scope, p.Key, s.now(), p.Error, p.Fence, p.Attempts).Scan(&deferred, &state, &fence)
		}
		return q.QueryRow(ctx, s.q.deferQ, p.Scope, p.Key, s.now(), storekit.Micros(p.Delay), p.Error, p.Fence, p.Attempts).
			Scan(&deferred, &state, &fence)
	}); err != nil {
		return wrap(ctx, "defer", err)
	}
	return guardedOutcome("defer", deferred, state, fence, p.Fence)
}

// guardedOutcome explains why a statement guarded by the record's state
// and by the fence want (0, Delete's, takes any) did not match, from the
// record's state and fence in the statement's snapshot (onUnknown,
// sqlDelete). A state the statement takes under that fence means that
// what else it checks (Defer's attempts) did not hold, or that a
// concurrent call moved the record after the snapshot.
func guardedOutcome(op string, done bool, state *string, fence *int64, want int64) error {
	switch {
	case done:
		return nil
	case state == nil:
		return fmt.Errorf("idem/postgres: %s: %w", op, store.ErrNotFound)
	case want > 0 && *fence != want:
		return fmt.Errorf("idem/postgres: %s: the record's fence is %d, not %d: %w", op, *fence, want, store.ErrLeaseLost)
	default:
		return fmt.Errorf("idem/postgres: %s: record is %s: %w", op, *state, store.ErrStateConflict)
	}
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return wrap(ctx, "ping", err)
	}
	return nil
}

// Close closes the pool if Open created it. It is safe to call twice.
func (s *Store) Close() error {
	first := s.closed.CompareAndSwap(false, true)
	if first && s.cache != nil {
		s.cache.close()
	}
	if first {
		s.standby.close()
	}
	if first && s.ownsPool {
		s.pool.Close()
	}
	if s.batch != nil {
		s.batch.group.Wait()
	}
	return nil
}

// wrap maps a driver error at the store boundary. Constraint violations are
// parameters the schema refuses; transient failures (see transient) are
// marked retryable; everything else (context cancellation, other server
// errors) is returned wrapped so the engine fails closed. A statement that
// the server cancelled because ctx ended reports ctx's error (see
// contextEnded).
func wrap(ctx context.Context, op string, err error) error {
	err = contextEnded(ctx, err)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23502", "23514", "22001", "22P02", "22021":
			// not null, check, string too long, bad text, bad UTF-8
			return fmt.Errorf("idem/postgres: %s: %w: %w", op, store.ErrInvalidParams, err)
		case "26000", "42P05":
			return fmt.Errorf("idem/postgres: %s: %w%s", op, err, poolerHint(pgErr))
		}
	}
	if transient(err) {
		err = store.Retryable(err)
	}
	return fmt.Errorf("idem/postgres: %s: %w", op, err)
}

// contextEnded returns ctx's error, with err behind it, for a statement
// that the server cancelled (SQLSTATE 57014, query_canceled) once ctx had
// ended. With pgx's default, a context that ends during a statement closes
// the connection (pgx sends the server a cancel request first) and the call
// fails with the context's error. A pool given to New may instead keep its
// connections with pgconn.CancelRequestContextWatcherHandler, which only
// sends the cancel request: the call then fails with the server's
// cancellation. Both say that the caller gave up, and the engine must be
// told so in the same way (it retries a final transition whose own
// deadline passed, and tells a caller that left from a store that failed).
// A statement cancelled while ctx is live (statement_timeout, an
// operator's pg_cancel_backend) keeps the server's error.
func contextEnded(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if ctx.Err() == nil || !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		return err
	}
	return fmt.Errorf("%w (the server cancelled the statement: %w)", ctx.Err(), err)
}

// transient reports failures that say nothing about the record: the
// connection could not be made or broke, the server is shutting down or
// refusing connections, or the transaction lost a serialization check or a
// deadlock (the server rolled it back).
func transient(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001", pgErr.Code == "40P01", // serialization failure, deadlock
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutdown, cannot connect now
			pgErr.Code == "53300",               // too many connections
			strings.HasPrefix(pgErr.Code, "08"): // connection exception
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// encodeHeader stores a nil header as NULL so it reads back nil. The JSON
// goes as text, cast to jsonb by the statement ($n::text::jsonb): a []byte
// would be sent as bytea in the exec and simple_protocol query modes, which
// do not ask the server for the parameter's type, and the cast would then
// read "\x7b..." as JSON.
func encodeHeader(h http.Header) (pgtype.Text, error) {
	if h == nil {
		return pgtype.Text{}, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return pgtype.Text{}, fmt.Errorf("idem/postgres: encode header: %w", err)
	}
	return pgtype.Text{String: string(b), Valid: true}, nil
}

// recordScan is what scanRecord reads a row into: one allocation for all
// of its columns and their destinations, instead of one per column.
type recordScan struct {
	state, policy              string
	status                     *int32
	headers, body              []byte
	omitted                    bool
	completedAt, reconcileAt   *time.Time
	deadLetteredAt             *time.Time
	lockedUntil, created       time.Time
	updated, expires           time.Time
	attempts, reconcileAttempt int32
	owner                      pgtype.Int8 // a value: a *int64 would cost an allocation per record
	dest                       [23]any
}

// scanRecord reads recordColumns, preceded by the action column when action
// is not nil.
func scanRecord(row pgx.Row, rec *store.Record, action *string) error {
	v := new(recordScan)
	dest := append(v.dest[:0], action,
		&rec.Scope, &rec.Key, &rec.Fingerprint, &v.state, &rec.Fence, &v.policy, &v.lockedUntil,
		&rec.RecoveryPoint, &v.status, &v.headers, &v.body,
		&v.omitted, &rec.LastError, &v.attempts, &v.created, &v.updated,
		&v.completedAt, &v.expires, &v.reconcileAt, &v.reconcileAttempt, &v.deadLetteredAt, &v.owner,
	)
	if action == nil {
		dest = dest[1:]
	}
	if err := row.Scan(dest...); err != nil {
		return err
	}
	rec.State = store.State(v.state)
	rec.LeasePolicy = store.LeasePolicy(v.policy)
	rec.LockedUntil = v.lockedUntil.UTC()
	rec.Attempts = int(v.attempts)
	rec.CreatedAt = v.created.UTC()
	rec.UpdatedAt = v.updated.UTC()
	rec.ExpiresAt = v.expires.UTC()
	rec.ReconcileAttempts = int(v.reconcileAttempt)
	rec.CompletedAt = utcOrZero(v.completedAt)
	rec.ReconcileAfter = utcOrZero(v.reconcileAt)
	rec.DeadLetteredAt = utcOrZero(v.deadLetteredAt)
	rec.Owner = v.owner.Int64 // NULL, 0, on the rows written before migration 011
	rec.Response = nil
	if v.status != nil {
		resp := &store.Response{Status: int(*v.status), Body: v.body, BodyOmitted: v.omitted}
		if v.headers != nil {
			if err := json.Unmarshal(v.headers, &resp.Header); err != nil {
				return fmt.Errorf("decode header: %w", err)
			}
		}
		rec.Response = resp
	}
	return nil
}

func collectRecords(rows pgx.Rows) ([]store.Record, error) {
	return collectWith(rows, func(row pgx.Row, rec *store.Record) error { return scanRecord(row, rec, nil) })
}

// collectWith reads every row with scan and closes rows.
func collectWith(rows pgx.Rows, scan func(pgx.Row, *store.Record) error) ([]store.Record, error) {
	defer rows.Close()
	var out []store.Record
	for rows.Next() {
		var rec store.Record
		if err := scan(rows, &rec); err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}

func utcOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
