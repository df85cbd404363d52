// Package sqlite is the embedded default store of idem, on the pure-Go SQLite
// driver modernc.org/sqlite.
//
// # Durability and concurrency
//
// The database runs in WAL mode with synchronous=FULL, so a record reported
// completed survives a crash of the process or of the machine. Each Store
// writes through exactly one connection and begins every write transaction
// with BEGIN IMMEDIATE: writers of one process queue on that connection, and
// writers of other processes (or other Stores on the same file) wait on
// SQLite's file lock for up to [Config.BusyTimeout]. Reserve therefore reads,
// decides and writes without any other writer in between, which makes it
// atomic across goroutines and processes.
//
// Reads (Get, ListUnknown, Ping, and the replays Reserve answers without
// writing) go through a separate pool of read-only connections, which WAL
// lets run beside the writer: a replay never queues behind another
// request's commit and its fsync.
//
// Writes of Reserve and Complete that queue for the writer while it is
// busy run together when it frees, in one immediate transaction with one
// savepoint per call, and share one commit and one fsync (group commit). A
// write that finds the writer idle runs alone, at once: no call waits for a
// timer. A call whose statements fail rolls back to its savepoint only.
//
// # Transactions
//
// [Store.DB] is the writer pool. A transaction begun on it is immediate, and
// [Store.ReserveTx], [Store.CompleteTx] and [Store.CheckpointTx] run inside
// it, so a handler's business write and the key's completion commit together:
//
//	tx, err := s.DB().BeginTx(ctx, nil)
//	...
//	_, err = tx.ExecContext(ctx, "INSERT INTO payments ...")
//	err = s.CompleteTx(ctx, tx, params)
//	err = tx.Commit()
//
// The pool has a single connection: while such a transaction is open, other
// writes of the same Store wait for it, and a call to a non-Tx write method
// from inside it would deadlock.
//
// # Time
//
// Times are stored as integer unix microseconds (UTC). Without
// [Config.Clock] the store uses the process clock: SQLite is embedded, so the
// process clock is the database's clock.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/groupcommit"
	"github.com/idem-go/idem/internal/migrate"
	"github.com/idem-go/idem/internal/sqltx"
	"github.com/idem-go/idem/store"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrationFS embed.FS

var (
	_ store.Store            = (*Store)(nil)
	_ store.TxStore[*sql.Tx] = (*Store)(nil)
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Clock is the time source for every expiry decision. Defaults to the
	// process clock (time.Now); tests inject a manual clock.
	Clock store.Clock
	// SkipMigrate skips applying pending migrations at Open, for
	// deployments that run Migrate (or `idem migrate`) separately.
	// Defaults to false: Open migrates.
	SkipMigrate bool
	// BusyTimeout is how long a write waits for another process's write
	// transaction on the same file before failing. Defaults to 5s; when
	// set, at least 1ms.
	BusyTimeout time.Duration
}

const defaultBusyTimeout = 5 * time.Second

func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = defaultBusyTimeout
	}
	return c
}

func (c Config) validate() error {
	if c.BusyTimeout < time.Millisecond {
		return fmt.Errorf("idem/sqlite: BusyTimeout must be at least 1ms, got %s", c.BusyTimeout)
	}
	return nil
}

// Store is an idem store on one SQLite database file. It is safe for
// concurrent use.
type Store struct {
	db     *sql.DB // the writer: one connection, immediate transactions
	reader *sql.DB // read-only pool; db itself for an in-memory database
	wst    *statements
	rst    *statements // wst for an in-memory database
	clock  store.Clock
	group  *groupcommit.Group[*writeOp] // Reserve and Complete writes
}

// Open opens (creating if needed) the database at path and, unless
// cfg.SkipMigrate, applies pending migrations. path is a file name, a
// "file:" URI, or ":memory:" for a private in-memory database (one
// connection, gone at Close; useful in tests only).
func Open(ctx context.Context, path string, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("idem/sqlite: empty database path")
	}
	busy := strconv.FormatInt(cfg.BusyTimeout.Milliseconds(), 10)
	memory := path == ":memory:"
	if !memory && !strings.HasPrefix(path, "file:") {
		// Created by the owner for the owner: the records hold tenants'
		// answers. SQLite gives its -wal and -shm files the database's
		// permissions.
		if err := createPrivate(path); err != nil {
			return nil, fmt.Errorf("idem/sqlite: create %s: %w", path, err)
		}
	}

	// Pragmas go in the DSN so that every connection the pool opens gets
	// them, including one reopened after an error. busy_timeout comes first
	// so that the journal_mode switch itself waits for other processes.
	writer, err := sql.Open("sqlite", dsn(path, url.Values{
		"_pragma": {
			"busy_timeout(" + busy + ")",
			"journal_mode(WAL)",
			"synchronous(FULL)",
			"foreign_keys(1)",
		},
		"_txlock": {"immediate"},
	}))
	if err != nil {
		return nil, fmt.Errorf("idem/sqlite: open: %w", err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)
	s := &Store{db: writer, reader: writer, wst: &statements{db: writer}, clock: cfg.Clock}
	s.rst = s.wst
	s.newGroup()
	if err := connect(ctx, writer, cfg.BusyTimeout); err != nil {
		writer.Close()
		return nil, fmt.Errorf("idem/sqlite: open %s: %w", path, err)
	}
	if !cfg.SkipMigrate {
		if err := s.Migrate(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}

	if !memory {
		reader, err := sql.Open("sqlite", dsn(path, url.Values{
			"_pragma":     {"busy_timeout(" + busy + ")", "foreign_keys(1)"},
			"_query_only": {"1"},
		}))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("idem/sqlite: open: %w", err)
		}
		n := max(4, runtime.GOMAXPROCS(0))
		reader.SetMaxOpenConns(n)
		reader.SetMaxIdleConns(n)
		reader.SetConnMaxLifetime(0)
		s.reader, s.rst = reader, &statements{db: reader}
	}
	// Under SkipMigrate the schema may not exist yet: the statements stay
	// unprepared (and fail when run) until Migrate.
	if err := s.prepare(ctx); err != nil && !cfg.SkipMigrate {
		s.Close()
		return nil, fmt.Errorf("idem/sqlite: open: %w", err)
	}
	return s, nil
}

// createPrivate creates an empty database file readable by its owner
// only, unless one exists.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

func (s *Store) prepare(ctx context.Context) error {
	if err := s.wst.prepare(ctx, writerQueries); err != nil {
		return err
	}
	if s.rst != s.wst {
		return s.rst.prepare(ctx, readerQueries)
	}
	return nil
}

// writer and read run statements on the writer and on the read pool.
func (s *Store) writer() querier { return prepared{st: s.wst} }
func (s *Store) read() querier   { return prepared{st: s.rst} }

// connect opens the writer's connection. The first connections to a new
// file race to switch it to WAL; SQLite reports SQLITE_BUSY to the losers
// at once, without its busy handler (the switch upgrades a read
// transaction), so connect retries for up to the busy timeout. Once the
// file is in WAL mode the pragma takes no lock and this returns at once.
func connect(ctx context.Context, db *sql.DB, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := db.PingContext(ctx)
		if err == nil || !busy(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// dsn appends the driver parameters to path. A plain file name is turned
// into a "file:" URI so that a '?' or '#' in it cannot be mistaken for the
// start of the parameters.
func dsn(path string, params url.Values) string {
	switch {
	case path == ":memory:":
		path = "file::memory:"
	case !strings.HasPrefix(path, "file:"):
		path = "file:" + uriPathEscaper.Replace(path)
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + params.Encode()
}

var uriPathEscaper = strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23")

var _ store.TxStore[*sql.Tx] = (*Store)(nil)

// DB returns the writer pool (one connection, immediate transactions), for
// callers that begin their own transaction and use the Tx methods.
func (s *Store) DB() *sql.DB { return s.db }

// InTx runs fn in an immediate transaction on the writer and commits it
// when fn returns nil (rolls back otherwise). With CheckpointTx it makes
// the store a phase.Store[*sql.Tx] for atomic phases.
func (s *Store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return sqltx.Run(ctx, s.db, fn)
}

// Migrate applies the pending embedded migrations in one immediate
// transaction, so concurrent Opens of one file apply each migration once.
func (s *Store) Migrate(ctx context.Context) error {
	all, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return fmt.Errorf("idem/sqlite: %w", err)
	}
	err = s.inTx(ctx, func(tx querier) error {
		if _, err := tx.ExecContext(ctx, qMigrationsTable); err != nil {
			return err
		}
		applied, err := appliedMigrations(ctx, tx)
		if err != nil {
			return err
		}
		return migrate.Apply(all, applied, func(m migrate.Migration) error {
			_, err := tx.ExecContext(ctx, m.SQL)
			return err
		}, func(m migrate.Migration) error {
			_, err := tx.ExecContext(ctx, qMigrationInsert, m.Version, m.Name, s.now().UnixMicro())
			return err
		})
	})
	if err == nil {
		err = s.prepare(ctx)
	}
	if err != nil {
		return fmt.Errorf("idem/sqlite: migrate: %w", err)
	}
	return nil
}

func appliedMigrations(ctx context.Context, q querier) (map[int]bool, error) {
	rows, err := q.QueryContext(ctx, qMigrationsApplied)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return migrate.AppliedVersions(rows)
}

// Ping checks that the database file can be read. It uses the read pool,
// so a health check does not queue behind the writer.
func (s *Store) Ping(ctx context.Context) error {
	var n int
	if err := s.reader.QueryRowContext(ctx, qPing).Scan(&n); err != nil {
		return wrap("ping", err)
	}
	return nil
}

// Close closes the database. Transactions begun on DB must be finished
// first.
func (s *Store) Close() error {
	s.group.Wait()
	errs := []error{s.wst.close()}
	if s.reader != s.db {
		errs = append(errs, s.rst.close(), s.reader.Close())
	}
	return errors.Join(append(errs, s.db.Close())...)
}

// now reads the clock at the precision the database keeps, so that values
// computed from it in Go and the values stored compare the same way.
func (s *Store) now() time.Time {
	return time.UnixMicro(s.clock().UnixMicro()).UTC()
}

// inTx runs fn in an immediate transaction on the writer.
func (s *Store) inTx(ctx context.Context, fn func(querier) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(prepared{st: s.wst, tx: tx}); err != nil {
		_ = tx.Rollback() // fn's error is the one worth reporting
		return err
	}
	return tx.Commit()
}
