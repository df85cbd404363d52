package sqlite

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/internal/sqltx"
	"github.com/idem-go/idem/store"
)

var _ store.TxStore[*sql.Tx] = (*Store)(nil)

// InTx runs fn in an immediate transaction on the writer and commits it
// when fn returns nil (rolls back otherwise). With CheckpointTx it makes
// the store a phase.Store[*sql.Tx] for atomic phases.
func (s *Store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return sqltx.Run(ctx, s.DB(), fn)
}
