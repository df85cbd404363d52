package postgres

import (
	"context"

	"github.com/idem-go/idem/store"
	"github.com/jackc/pgx/v5"
)

var _ store.TxStore[pgx.Tx] = (*Store)(nil)

// InTx runs fn in a transaction on the store's pool and commits it when fn
// returns nil (rolls back otherwise). With CheckpointTx it makes the store
// a phase.Store[pgx.Tx] for atomic phases.
func (s *Store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.inTx(ctx, fn)
}
