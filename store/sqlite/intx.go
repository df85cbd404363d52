package sqlite

import (
	"context"
	"database/sql"
	"errors"
)

// InTx runs fn in an immediate transaction on the writer and commits it
// when fn returns nil (rolls back otherwise). With CheckpointTx it makes
// the store an idem.PhaseStore[*sql.Tx] for atomic phases.
func (s *Store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	return tx.Commit()
}

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
