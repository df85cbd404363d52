// Package sqltx runs a function in a database/sql transaction, for the SQL
// stores' InTx.
package sqltx

import (
	"context"
	"database/sql"
	"errors"
)

// Run begins a transaction on db, runs fn in it, and commits when fn
// returns nil; otherwise it rolls back and returns fn's error (with the
// rollback's, if that failed too).
func Run(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			return errors.Join(err, rerr)
		}
		return err
	}
	return tx.Commit()
}
