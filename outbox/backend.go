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
	// inTx runs fn in a transaction of the outbox's database, committed
	// when fn returns nil.
	inTx(ctx context.Context, fn func(tx TTx) error) error
	// lookup returns the message's row, or errNoRow.
	lookup(ctx context.Context, key, kind string) (row, error)
	// record stores downstreamID unless one is already recorded, and
	// returns the recorded one.
	record(ctx context.Context, m Message, jobID int64, downstreamID string, attempt int) (string, error)
	// undelivered returns those of jobIDs that carry an undelivered
	// message, each with the time its dead letter was settled (zero if not).
	undelivered(ctx context.Context, jobIDs []int64) (map[int64]time.Time, error)
	// claimDead claims the dead message (key, kind) carried by jobID for
	// one call of OnDead, for lease, and returns the claim's number (1 for
	// the first). It returns errNoRow when the message is settled,
	// delivered or carried by another job, or another claim holds it.
	claimDead(ctx context.Context, key, kind string, jobID int64, lease time.Duration) (int, error)
	// releaseDead ends claim number call without settling the message:
	// no pass claims it again for wait.
	releaseDead(ctx context.Context, key, kind string, jobID int64, call int, wait time.Duration) error
	// settleDead records that OnDead returned nil for the message.
	settleDead(ctx context.Context, key, kind string, jobID int64) error
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
	// deadSettledAt is when OnDead returned nil for the dead letter of
	// jobID; zero if it has not.
	deadSettledAt time.Time
}

// pgBackend is the table on PostgreSQL, in the pool's search_path.
type pgBackend struct{ pool *pgxpool.Pool }

func (b pgBackend) enqueue(ctx context.Context, tx pgx.Tx, m Message, jobID int64) error {
	_, err := tx.Exec(ctx, pgEnqueue, m.Key, m.Kind, m.Fence, jobID)
	return err
}

func (b pgBackend) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, b.pool, fn)
}

func (b pgBackend) lookup(ctx context.Context, key, kind string) (row, error) {
	var (
		r           row
		id          *string
		deliveredAt *time.Time
		settledAt   *time.Time
	)
	err := b.pool.QueryRow(ctx, pgLookup, key, kind).Scan(&r.fence, &r.jobID, &id, &r.attempts, &r.createdAt, &deliveredAt, &settledAt)
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
	if settledAt != nil {
		r.deadSettledAt = settledAt.UTC()
	}
	r.createdAt = r.createdAt.UTC()
	return r, nil
}

func (b pgBackend) record(ctx context.Context, m Message, jobID int64, downstreamID string, attempt int) (string, error) {
	var stored string
	err := b.pool.QueryRow(ctx, pgRecord, m.Key, m.Kind, m.Fence, jobID, downstreamID, attempt).Scan(&stored)
	return stored, err
}

func (b pgBackend) undelivered(ctx context.Context, jobIDs []int64) (map[int64]time.Time, error) {
	rows, err := b.pool.Query(ctx, pgUndelivered, jobIDs)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]time.Time, len(jobIDs))
	var (
		id        int64
		settledAt *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &settledAt}, func() error {
		out[id] = time.Time{}
		if settledAt != nil {
			out[id] = settledAt.UTC()
		}
		return nil
	})
	return out, err
}

func (b pgBackend) claimDead(ctx context.Context, key, kind string, jobID int64, lease time.Duration) (int, error) {
	var call int
	err := b.pool.QueryRow(ctx, pgDeadClaim, key, kind, jobID, lease.Microseconds()).Scan(&call)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, errNoRow
	}
	return call, err
}

func (b pgBackend) releaseDead(ctx context.Context, key, kind string, jobID int64, call int, wait time.Duration) error {
	_, err := b.pool.Exec(ctx, pgDeadRelease, key, kind, jobID, call, wait.Microseconds())
	return err
}

func (b pgBackend) settleDead(ctx context.Context, key, kind string, jobID int64) error {
	_, err := b.pool.Exec(ctx, pgDeadSettle, key, kind, jobID)
	return err
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

func (b sqliteBackend) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (b sqliteBackend) lookup(ctx context.Context, key, kind string) (row, error) {
	var (
		r           row
		id          sql.NullString
		createdAt   int64
		deliveredAt sql.NullInt64
		settledAt   sql.NullInt64
	)
	err := b.db.QueryRowContext(ctx, sqliteLookup, key, kind).Scan(&r.fence, &r.jobID, &id, &r.attempts, &createdAt, &deliveredAt, &settledAt)
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
	if settledAt.Valid {
		r.deadSettledAt = time.UnixMicro(settledAt.Int64).UTC()
	}
	return r, nil
}

func (b sqliteBackend) record(ctx context.Context, m Message, jobID int64, downstreamID string, attempt int) (string, error) {
	var stored string
	err := b.db.QueryRowContext(ctx, sqliteRecord, m.Key, m.Kind, m.Fence, jobID, downstreamID, attempt,
		time.Now().UnixMicro()).Scan(&stored)
	return stored, err
}

func (b sqliteBackend) undelivered(ctx context.Context, jobIDs []int64) (map[int64]time.Time, error) {
	ids, err := json.Marshal(jobIDs)
	if err != nil {
		return nil, err
	}
	rows, err := b.db.QueryContext(ctx, sqliteUndelivered, string(ids))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[int64]time.Time, len(jobIDs))
	for rows.Next() {
		var (
			id        int64
			settledAt sql.NullInt64
		)
		if err := rows.Scan(&id, &settledAt); err != nil {
			return nil, err
		}
		out[id] = time.Time{}
		if settledAt.Valid {
			out[id] = time.UnixMicro(settledAt.Int64).UTC()
		}
	}
	return out, rows.Err()
}

func (b sqliteBackend) claimDead(ctx context.Context, key, kind string, jobID int64, lease time.Duration) (int, error) {
	now := time.Now()
	var call int
	err := b.db.QueryRowContext(ctx, sqliteDeadClaim, key, kind, jobID, now.UnixMicro(), now.Add(lease).UnixMicro()).Scan(&call)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, errNoRow
	}
	return call, err
}

func (b sqliteBackend) releaseDead(ctx context.Context, key, kind string, jobID int64, call int, wait time.Duration) error {
	_, err := b.db.ExecContext(ctx, sqliteDeadRelease, key, kind, jobID, call, time.Now().Add(wait).UnixMicro())
	return err
}

func (b sqliteBackend) settleDead(ctx context.Context, key, kind string, jobID int64) error {
	_, err := b.db.ExecContext(ctx, sqliteDeadSettle, key, kind, jobID, time.Now().UnixMicro())
	return err
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
