package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/internal/migrate"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// migrateLockWait is how long Migrate waits for another process that is
// migrating the same database.
const migrateLockWait = 60 * time.Second

// Migrate applies the pending migrations of migrations/ and records each in
// idem_migrations. It holds the named lock GET_LOCK('idem_migrate.<db>')
// meanwhile, so concurrent openers apply each migration once; the lock is
// released at the end, or by the server if the session dies.
//
// DDL commits implicitly on both servers, so a migration and its
// idem_migrations row are not atomic: every migration is written to be
// re-runnable (CREATE TABLE IF NOT EXISTS ...).
func (s *Store) Migrate(ctx context.Context) error {
	all, err := migrate.Load(migrationsFS, "migrations")
	if err != nil {
		return err
	}
	// The lock belongs to a session: pin one connection for the whole run.
	conn, err := s.q.Conn(ctx)
	if err != nil {
		return wrap("migrate", err)
	}
	defer conn.Close()

	a, err := qMigrateLock.bind(args{"timeout_s": int(migrateLockWait / time.Second)})
	if err != nil {
		return wrap("migrate", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, qMigrateLock.sql, a...).Scan(&got); err != nil {
		return wrap("migrate: lock", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("idem/mysql: migrate: another process held the migration lock for %s", migrateLockWait)
	}
	defer func() {
		// Released even when ctx is done, so the next opener does not wait;
		// if this fails the server frees it when the connection closes.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var released sql.NullInt64
		if conn.QueryRowContext(rctx, qMigrateUnlock.sql).Scan(&released) != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()

	if _, err := conn.ExecContext(ctx, qMigrateTable.sql); err != nil {
		return wrap("migrate", err)
	}
	rows, err := conn.QueryContext(ctx, qMigrateApplied.sql)
	if err != nil {
		return wrap("migrate", err)
	}
	applied, err := migrate.AppliedVersions(rows)
	if err := errors.Join(err, rows.Close()); err != nil {
		return wrap("migrate", err)
	}

	err = migrate.Apply(all, applied, func(m migrate.Migration) error {
		// MySQL runs one statement per call (DDL commits implicitly, so a
		// migration is not atomic here: keep each to one idempotent step).
		stmts, err := splitStatements(m.SQL)
		if err != nil {
			return err
		}
		for _, stmt := range stmts {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				if n := errorNumber(err); n != errDupFieldName && n != errDupKeyName {
					return err
				}
			}
		}
		return nil
	}, func(m migrate.Migration) error {
		rec, err := qMigrateRecord.bind(args{"version": m.Version, "name": m.Name})
		if err == nil {
			_, err = conn.ExecContext(ctx, qMigrateRecord.sql, rec...)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("idem/mysql: %w", err)
	}
	return nil
}
