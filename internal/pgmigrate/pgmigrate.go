// Package pgmigrate applies embedded migrations inside a PostgreSQL
// transaction, for the PostgreSQL store and the outbox, which keep their own
// version tables.
package pgmigrate

import (
	"context"

	"github.com/idem-go/idem/internal/migrate"
	"github.com/jackc/pgx/v5"
)

// Tables names the statements of a version table: create it if missing,
// list the applied versions, and record one ($1 version, $2 name).
type Tables struct {
	Create, Applied, Record string
}

// Apply runs the pending migrations of all in tx, recording each. The
// caller holds the lock that serialises migrators (an advisory lock).
func Apply(ctx context.Context, tx pgx.Tx, all []migrate.Migration, t Tables) error {
	if _, err := tx.Exec(ctx, t.Create); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, t.Applied)
	if err != nil {
		return err
	}
	applied, err := migrate.AppliedVersions(rows)
	rows.Close()
	if err != nil {
		return err
	}
	return migrate.Apply(all, applied, func(m migrate.Migration) error {
		_, err := tx.Exec(ctx, m.SQL)
		return err
	}, func(m migrate.Migration) error {
		_, err := tx.Exec(ctx, t.Record, m.Version, m.Name)
		return err
	})
}
