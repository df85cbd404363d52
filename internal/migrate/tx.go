package migrate

import "context"

// Tables names the statements of a version table: create it if missing,
// list the applied versions, and record one ($1 version, $2 name).
type Tables struct {
	Create, Applied, Record string
}

// ClosingRows is Rows closed as pgx closes them (no error).
type ClosingRows interface {
	Rows
	Close()
}

// Tx is the part of a pgx transaction (pgx.Tx) ApplyIn uses, spelled
// without pgx so that the core module, which holds this package, never
// requires a driver: T is the driver's command tag, R its rows.
type Tx[T any, R ClosingRows] interface {
	Exec(ctx context.Context, sql string, args ...any) (T, error)
	Query(ctx context.Context, sql string, args ...any) (R, error)
}

// ApplyIn runs the pending migrations of all in tx, recording each in the
// version table t names, for the PostgreSQL store and the outbox, which
// keep their own version tables. The caller holds the lock that serialises
// migrators (an advisory lock).
func ApplyIn[T any, R ClosingRows](ctx context.Context, tx Tx[T, R], all []Migration, t Tables) error {
	if _, err := tx.Exec(ctx, t.Create); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, t.Applied)
	if err != nil {
		return err
	}
	applied, err := AppliedVersions(rows)
	rows.Close()
	if err != nil {
		return err
	}
	return Apply(all, applied, func(m Migration) error {
		_, err := tx.Exec(ctx, m.SQL)
		return err
	}, func(m Migration) error {
		_, err := tx.Exec(ctx, t.Record, m.Version, m.Name)
		return err
	})
}
