package idem

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/store"
)

// PhaseStore is a SQL store that can run a function in a transaction of its
// database and advance a recovery point inside it. The PostgreSQL store
// implements PhaseStore[pgx.Tx]; the SQLite and MySQL stores
// PhaseStore[*sql.Tx].
type PhaseStore[T any] interface {
	// InTx runs fn in a new transaction and commits it if fn returns nil.
	InTx(ctx context.Context, fn func(tx T) error) error
	CheckpointTx(ctx context.Context, tx T, p store.CheckpointParams) error
}

// Phase is one atomic phase of a request (Brandur Leach's pattern): its
// local writes and its recovery point commit in one transaction, and it
// performs at most one foreign side effect, so that a crash either undoes
// the whole phase or leaves it done.
type Phase[T any] struct {
	// Name becomes the record's recovery point when the phase commits.
	// Names must be distinct.
	Name string
	// Foreign, when set, performs the phase's foreign side effect before
	// its transaction begins, so a slow provider does not hold a database
	// transaction (on SQLite, the only writer) open. Capture its result in
	// a variable that Run records. A crash after Foreign but before the
	// commit re-runs the whole phase on resume, exactly as a crash inside
	// the transaction would: send the idempotency key (and the fence) to
	// the provider so that the second call does nothing new.
	Foreign func(ctx context.Context) error
	// Run does the phase's local work in tx; the recovery point commits
	// with it.
	Run func(ctx context.Context, tx T) error
}

// RunPhases runs the phases that follow x's recovery point, each in its
// own transaction that also advances the recovery point. A request that
// took over a dead holder's lease under store.LeaseResume therefore
// continues where the holder stopped and never re-runs a committed phase.
//
// A phase that fails rolls back and RunPhases returns its error; the
// recovery point stays at the last committed phase. If the failed phase's
// foreign side effect may have happened, call x.Uncertain.
func RunPhases[T any](ctx context.Context, x *Execution, db PhaseStore[T], phases ...Phase[T]) error {
	start := 0
	if rp := x.RecoveryPoint(); rp != "" {
		start = -1
		for i, p := range phases {
			if p.Name == rp {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return fmt.Errorf("idem: recovery point %q is not one of the phases", rp)
		}
	}
	for _, p := range phases[start:] {
		if p.Foreign != nil {
			if err := p.Foreign(ctx); err != nil {
				return fmt.Errorf("idem: phase %s: %w", p.Name, err)
			}
		}
		err := db.InTx(ctx, func(tx T) error {
			if p.Run != nil {
				if err := p.Run(ctx, tx); err != nil {
					return err
				}
			}
			return db.CheckpointTx(ctx, tx, x.CheckpointParams(p.Name))
		})
		if err != nil {
			return fmt.Errorf("idem: phase %s: %w", p.Name, err)
		}
		x.Checkpointed(p.Name)
	}
	return nil
}
