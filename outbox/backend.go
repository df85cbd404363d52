package outbox

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idem-go/idem/internal/migrate"
)

//go:embed migrations/postgres/*.sql migrations/sqlite/*.sql
var migrationFS embed.FS

// backend is the outbox's own table on one database. River's tables are
// reached through River's client, never from here.
type backend[TTx any] interface {
	// enqueue writes the message's row in the caller's transaction.
	enqueue(ctx context.Context, tx TTx, m Message, jobID int64) error
	// lookup returns the message's row, or errNoRow.
	lookup(ctx context.Context, key, kind string) (row, error)
	// record stores downstreamID unless one is already recorded, and
	// returns the recorded one.
	record(ctx context.Context, m Message, jobID int64, downstreamID string, attempt int) (string, error)
	// undelivered returns those of jobIDs that carry an undelivered message.
	undelivered(ctx context.Context, jobIDs []int64) (map[int64]bool, error)
	// migrate applies River's migrations (through m) and the outbox's own.
	migrate(ctx context.Context, m *rivermigrate.Migrator[TTx]) error
}

var errNoRow = errors.New("outbox: no row")

type row struct {
	fence        int64
	jobID        int64
	downstreamID string // "" until delivered
	attempts     int
	createdAt    time.Time
	deliveredAt  time.Time
}

// pgBackend is the table on PostgreSQL, in the pool's search_path.
type pgBackend struct{ pool *pgxpool.Pool }

func (b pgBackend) enqueue(ctx context.Context, tx pgx.Tx, m Message, jobID int64) error {
	_, err := tx.Exec(ctx, pgEnqueue, m.Key, m.Kind, m.Fence, jobID)
	return err
}

func (b pgBackend) lookup(ctx context.Context, key, kind string) (row, error) {
	var (
		r           row
		id          *string
		deliveredAt *time.Time
	)
	err := b.pool.QueryRow(ctx, pgLookup, key, kind).Scan(&r.fence, &r.jobID, &id, &r.attempts, &r.createdAt, &deliveredAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return row{}, errNoRow
	}
	if err != nil {
		return row{}, err
	}
	if id != nil {
		r.downstreamID = *id
	}
	if deliveredAt != nil {
		r.deliveredAt = deliveredAt.UTC()
	}
	r.createdAt = r.createdAt.UTC()
	return r, nil
}

func (b pgBackend) record(ctx context.Context, m Message, jobID int64, downstreamID string, attempt int) (string, error) {
	var stored string
	err := b.pool.QueryRow(ctx, pgRecord, m.Key, m.Kind, m.Fence, jobID, downstreamID, attempt).Scan(&stored)
	return stored, err
}

func (b pgBackend) undelivered(ctx context.Context, jobIDs []int64) (map[int64]bool, error) {
	rows, err := b.pool.Query(ctx, pgUndelivered, jobIDs)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	out := make(map[int64]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// migrate holds a session advisory lock while River migrates through the
// pool and the outbox's own migrations run, so that processes starting
// together apply each migration once. River applies each of its
// migrations in its own transaction (some PostgreSQL migrations cannot
// share one), hence a session lock rather than a transaction's.
func (b pgBackend) migrate(ctx context.Context, m *rivermigrate.Migrator[pgx.Tx]) (err error) {
	own, err := migrate.Load(migrationFS, "migrations/postgres")
	if err != nil {
		return err
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, pgMigrateLock); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), pgMigrateUnlock); uerr != nil {
			// Closing the session is what releases the lock then; the pool
			// drops the closed connection.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river: %w", err)
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		return migrate.ApplyIn(ctx, tx, own, migrate.Tables{
			Create: pgMigrationsTable, Applied: pgMigrationsApplied, Record: pgMigrationInsert,
		})
	})
}

// sqliteBackend is the table on SQLite (database/sql, modernc driver).
type sqliteBackend struct{ db *sql.DB }

func (b sqliteBackend) enqueue(ctx context.Context, tx *sql.Tx, m Message, jobID int64) error {
	_, err := tx.ExecContext(ctx, sqliteEnqueue, m.Key, m.Kind, m.Fence, jobID, time.Now().UnixMicro())
	return err
}

func (b sqliteBackend) lookup(ctx context.Context, key, kind string) (row, error) {
	var (
		r           row
		id          sql.NullString
		createdAt   int64
		deliveredAt sql.NullInt64
	)
	err := b.db.QueryRowContext(ctx, sqliteLookup, key, kind).Scan(&r.fence, &r.jobID, &id, &r.attempts, &createdAt, &deliveredAt)
	if errors.Is(err, sql.ErrNoRows) {
		return row{}, errNoRow
	}
	if err != nil {
		return row{}, err
	}
	r.downstreamID = id.String
	r.createdAt = time.UnixMicro(createdAt).UTC()
	if deliveredAt.Valid {
		r.deliveredAt = time.UnixMicro(deliveredAt.Int64).UTC()
	}
	return r, nil
}

func (b sqliteBackend) record(ctx context.Context, m Message, jobID int64, downstreamID string, attempt int) (string, error) {
	var stored string
	err := b.db.QueryRowContext(ctx, sqliteRecord, m.Key, m.Kind, m.Fence, jobID, downstreamID, attempt,
		time.Now().UnixMicro()).Scan(&stored)
	return stored, err
}

func (b sqliteBackend) undelivered(ctx context.Context, jobIDs []int64) (map[int64]bool, error) {
	ids, err := json.Marshal(jobIDs)
	if err != nil {
		return nil, err
	}
	rows, err := b.db.QueryContext(ctx, sqliteUndelivered, string(ids))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[int64]bool, len(jobIDs))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out[id] = true
	}
	return out, rows.Err()
}

// migrate runs River's migrations and the outbox's own in one transaction,
// immediate when the database is opened with _txlock=immediate as
// documented: SQLite has no advisory lock, and the write lock that
// transaction holds is what makes processes starting together apply each
// migration once. River's MigrateTx is deprecated because some PostgreSQL
// migrations cannot share a transaction; SQLite's DDL is transactional and
// River's SQLite migrations have no such step.
func (b sqliteBackend) migrate(ctx context.Context, m *rivermigrate.Migrator[*sql.Tx]) error {
	own, err := migrate.Load(migrationFS, "migrations/sqlite")
	if err != nil {
		return err
	}
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	// Rollback is a no-op after Commit.
	defer func() { _ = tx.Rollback() }()
	//lint:ignore SA1019 MigrateTx is deprecated for PostgreSQL's sake; see above.
	if _, err := m.MigrateTx(ctx, tx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river: %w", err)
	}
	if _, err := tx.ExecContext(ctx, sqliteMigrationsTable); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, sqliteMigrationsApplied)
	if err != nil {
		return err
	}
	applied, err := migrate.AppliedVersions(rows)
	if err := errors.Join(err, rows.Close()); err != nil {
		return err
	}
	err = migrate.Apply(own, applied, func(m migrate.Migration) error {
		_, err := tx.ExecContext(ctx, m.SQL)
		return err
	}, func(m migrate.Migration) error {
		_, err := tx.ExecContext(ctx, sqliteMigrationInsert, m.Version, m.Name, time.Now().UnixMicro())
		return err
	})
	if err != nil {
		return err
	}
	return tx.Commit()
}
