// Package mysql is the MySQL/MariaDB store of idem, built on
// github.com/go-sql-driver/mysql.
//
// # Servers
//
// Tested on MariaDB 10.11. The SQL is written to run unchanged on MySQL 8.0
// and later; the comments in queries.sql and queries.go name the places
// where the two servers differ. It needs FOR UPDATE SKIP LOCKED
// (MariaDB >= 10.6, MySQL >= 8.0) and enforced CHECK constraints
// (MariaDB >= 10.2, MySQL >= 8.0.16).
//
// # Round trips
//
// A store made by [Open] spends one round trip per operation on the request
// path: Reserve (a new key or a replay) and Complete each send one packet and
// read one answer. Reserve needs an upsert and a read of the resulting row.
// MySQL cannot return the row of a statement (no RETURNING, and UPDATE has
// none on MariaDB either); MariaDB >= 10.5 can, with INSERT ... ON DUPLICATE
// KEY UPDATE ... RETURNING, but measured no faster than the portable batch
// below, so one code path serves both servers. Open keeps a second, private
// connection pool with multiStatements=true and sends
//
//	START TRANSACTION; INSERT ... ON DUPLICATE KEY UPDATE ...; SELECT ... FOR UPDATE; COMMIT
//
// as one query. A replay changes no column, so InnoDB writes nothing for it
// (no undo, no redo, no binlog event); it only takes the row lock for the
// microseconds the batch runs. A store made by [New] on a *sql.DB that does
// not allow multi-statement queries runs the same statements in an explicit
// transaction: four round trips with interpolateParams=true, more without.
//
// In a caller's transaction, ReserveTx costs two round trips (the upsert and
// the read) and CompleteTx one, so BEGIN, ReserveTx, CompleteTx and COMMIT
// on [Store.DB] take five.
//
// # Transactions
//
// [Store.ReserveTx], [Store.CompleteTx] and [Store.CheckpointTx] run inside
// the caller's *sql.Tx (begun on [Store.DB]), so a business write and the
// key's completion commit together. A deadlock inside the caller's
// transaction rolls the whole transaction back; those methods return the
// error and the caller retries its transaction. The non-transactional
// methods retry deadlocks (error 1213) and duplicate-key races (1062)
// themselves, a bounded number of times.
package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/sqltx"
	"github.com/idem-go/idem/store"
)

var (
	_ store.Store            = (*Store)(nil)
	_ store.TxStore[*sql.Tx] = (*Store)(nil)
	_ querier                = (*sql.DB)(nil)
	_ querier                = (*sql.Tx)(nil)
	_ querier                = (*sql.Conn)(nil)
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Clock, when set, replaces the database server's clock
	// (UTC_TIMESTAMP(6)) in every statement that needs the time; tests use
	// it to move time without sleeping. Defaults to nil: the server's clock,
	// so that app servers with skewed clocks agree on lease expiry.
	Clock store.Clock
	// SkipMigrate leaves the schema alone at Open and New (run Migrate, or
	// `idem migrate`, separately). Defaults to false: pending migrations are
	// applied under a GET_LOCK so that concurrent openers apply them once.
	SkipMigrate bool
	// MaxConns caps the open connections of the pool the store runs its own
	// statements on (Open only; with New the caller tunes its *sql.DB).
	// Defaults to 0: no cap, as in database/sql. Mind the server's
	// max_connections (151 by default) across all instances.
	MaxConns int
}

// Store is the MySQL/MariaDB store. It is safe for concurrent use.
type Store struct {
	db    *sql.DB // returned by DB, for callers' transactions
	q     *sql.DB // the store's own statements
	batch bool    // q accepts multi-statement queries with client-side interpolation
	owned []*sql.DB
	clock store.Clock
	// retries counts transient failures (deadlock, duplicate key) that were
	// retried; tests read it to see the retry path taken.
	retries atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

// querier is what the store's statements run on: the pool, a caller's
// transaction, or one pinned connection.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Open connects to the database named by dsn, in go-sql-driver/mysql format
// (e.g. "user:pass@tcp(127.0.0.1:3306)/idem"), applies pending migrations
// unless cfg.SkipMigrate, and returns the store.
//
// Open sets on the parsed DSN what the store relies on, whatever dsn says:
// parseTime=true, loc=UTC, clientFoundRows=true (affected rows count matched
// rows, so a guarded UPDATE that changes nothing still reports its match)
// and interpolateParams=true (one round trip per statement instead of
// prepare + execute). Unless dsn sets maxAllowedPacket, it is read from
// the server on each new connection: a statement whose text would pass the
// server's limit (a large response body, whose zero bytes take two bytes
// each once escaped) is then sent as a prepared statement with its body
// apart, stored whole when the server admits it and refused with a definite
// error otherwise, where the driver's own limit (64 MiB) would send the text
// and have the server reset the connection. The pool returned by
// [Store.DB] has these settings; the store's own pool also has
// multiStatements=true, which is never exposed.
func Open(ctx context.Context, dsn string, cfg Config) (*Store, error) {
	base, err := mysqldrv.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("idem/mysql: %w", err)
	}
	base.ParseTime = true
	base.Loc = time.UTC
	base.ClientFoundRows = true
	base.InterpolateParams = true
	if base.MaxAllowedPacket == mysqldrv.NewConfig().MaxAllowedPacket {
		base.MaxAllowedPacket = 0 // the server's
	}
	batchCfg := base.Clone()
	batchCfg.MultiStatements = true

	pubConnector, err := mysqldrv.NewConnector(base)
	if err != nil {
		return nil, fmt.Errorf("idem/mysql: %w", err)
	}
	batchConnector, err := mysqldrv.NewConnector(batchCfg)
	if err != nil {
		return nil, fmt.Errorf("idem/mysql: %w", err)
	}
	pub := sql.OpenDB(pubConnector)
	own := sql.OpenDB(batchConnector)
	// database/sql keeps only two idle connections by default; under
	// concurrent requests the rest would be closed and redialed each time.
	own.SetMaxIdleConns(32)
	if cfg.MaxConns > 0 {
		own.SetMaxOpenConns(cfg.MaxConns)
		own.SetMaxIdleConns(min(32, cfg.MaxConns))
	}

	s := &Store{db: pub, q: own, batch: true, owned: []*sql.DB{own, pub}, clock: cfg.Clock}
	if err := s.start(ctx, cfg); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// New returns a store on db, which stays owned by the caller: Close does not
// close it. db must reach a MySQL/MariaDB database; parseTime and loc do not
// matter (times are sent as UTC text and read back as UTC). Reserve takes one
// round trip when db was opened with multiStatements=true and
// interpolateParams=true (New probes for it), and an explicit four-statement
// transaction otherwise.
func New(ctx context.Context, db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", store.ErrInvalidParams)
	}
	s := &Store{db: db, q: db, clock: cfg.Clock}
	ok, err := probeBatch(ctx, db)
	if err != nil {
		return nil, err
	}
	s.batch = ok
	if err := s.start(ctx, cfg); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) start(ctx context.Context, cfg Config) error {
	if err := s.Ping(ctx); err != nil {
		return err
	}
	if cfg.SkipMigrate {
		return nil
	}
	return s.Migrate(ctx)
}

// probeBatch reports whether db runs multi-statement queries with
// client-side parameters. The server answers a refused multi-statement
// query with a syntax error (1064); anything else is a real failure.
func probeBatch(ctx context.Context, db *sql.DB) (bool, error) {
	a, err := qProbeBatch.bind(args{"one": 1, "two": 2})
	if err != nil {
		return false, err
	}
	rows, err := db.QueryContext(ctx, qProbeBatch.sql, a...)
	if err != nil {
		var me *mysqldrv.MySQLError
		if errors.As(err, &me) && me.Number == errSyntax {
			return false, nil
		}
		return false, fmt.Errorf("idem/mysql: probe: %w", err)
	}
	for rows.Next() {
	}
	if err := rows.Close(); err != nil {
		return false, fmt.Errorf("idem/mysql: probe: %w", err)
	}
	return true, nil
}

var _ store.TxStore[*sql.Tx] = (*Store)(nil)

// DB returns the pool for callers that begin their own transaction and pass
// it to ReserveTx, CompleteTx or CheckpointTx.
func (s *Store) DB() *sql.DB { return s.db }

// InTx runs fn in a transaction on the pool DB returns and commits it when
// fn returns nil (rolls back otherwise). With CheckpointTx it makes the
// store a phase.Store[*sql.Tx] for atomic phases.
func (s *Store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return sqltx.Run(ctx, s.db, fn)
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.q.PingContext(ctx); err != nil {
		return fmt.Errorf("idem/mysql: ping: %w", err)
	}
	return nil
}

// Close closes the pools that Open opened. A store made by New leaves its
// *sql.DB open. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		for _, db := range s.owned {
			errs = append(errs, db.Close())
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
