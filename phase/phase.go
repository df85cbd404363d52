// Package phase runs a request as atomic phases: each phase's local writes
// and the record's recovery point commit in one transaction of the
// application's database, so that a request that took over a dead
// holder's lease under store.LeaseResume continues where the holder
// stopped and never re-runs a committed phase.
//
// The PostgreSQL store is a Store[pgx.Tx]; the SQLite and MySQL stores are
// Store[*sql.Tx]. The engine must run the route with
// Config.LeasePolicy set to store.LeaseResume.
package phase

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// Store is a SQL store that can run a function in a transaction of its
// database and advance a recovery point inside it.
type Store[T any] interface {
	// InTx runs fn in a new transaction and commits it if fn returns nil.
	InTx(ctx context.Context, fn func(tx T) error) error
	// CheckpointTx advances the record's recovery point in tx; it fails
	// with store.ErrLeaseLost if the execution no longer holds the key.
	CheckpointTx(ctx context.Context, tx T, p store.CheckpointParams) error
}

// Phase is one atomic phase of a request: its local writes and its
// recovery point commit in one transaction, and it performs at most one
// foreign side effect, so that a crash either undoes the whole phase or
// leaves it done.
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

// check refuses phases whose names cannot serve as recovery points: a
// resumed request finds its place by name.
func check[T any](phases []Phase[T]) error {
	seen := make(map[string]bool, len(phases))
	for i, p := range phases {
		if p.Name == "" {
			return fmt.Errorf("phase: phase %d has no name", i)
		}
		if seen[p.Name] {
			return fmt.Errorf("phase: two phases are named %q", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// Run runs the phases that follow x's recovery point, each in its own
// transaction of db that also advances the recovery point.
//
// A phase that fails rolls back and Run returns its error; the recovery
// point stays at the last committed phase. Once x's lease is known lost
// (Execution.LeaseLost), no further phase begins: Run returns an error
// wrapping store.ErrLeaseLost. If the failed phase's foreign side effect
// may have happened, call x.Uncertain. A recovery point that names none
// of the phases (the handler's phases were renamed while a request was in
// flight) is an error, and so are an empty or a repeated name: no phase
// runs.
//
// With no execution (x nil: a request without a key that the engine let
// through, under the Stripe profile or KeyRequired false) the phases run
// in their transactions from the first, with no recovery point to keep.
func Run[T any](ctx context.Context, x *idem.Execution, db Store[T], phases ...Phase[T]) error {
	if err := check(phases); err != nil {
		return err
	}
	start, rp := 0, ""
	if x != nil {
		rp = x.RecoveryPoint()
	}
	if rp != "" {
		start = -1
		for i, p := range phases {
			if p.Name == rp {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return fmt.Errorf("phase: recovery point %q is not one of the phases", rp)
		}
	}
	for _, p := range phases[start:] {
		if x != nil && x.LeaseLost() {
			// Another execution holds the key (or it left in_progress):
			// this phase's recovery point could not commit, and its
			// foreign side effect would be made by a holder that has no
			// right to it.
			return fmt.Errorf("phase %s: %w", p.Name, store.ErrLeaseLost)
		}
		if p.Foreign != nil {
			if err := p.Foreign(ctx); err != nil {
				return fmt.Errorf("phase %s: %w", p.Name, err)
			}
		}
		err := db.InTx(ctx, func(tx T) error {
			if p.Run != nil {
				if err := p.Run(ctx, tx); err != nil {
					return err
				}
			}
			if x == nil {
				return nil
			}
			return db.CheckpointTx(ctx, tx, x.CheckpointParams(p.Name))
		})
		if err != nil {
			return fmt.Errorf("phase %s: %w", p.Name, err)
		}
		if x != nil {
			x.Checkpointed(p.Name)
		}
	}
	return nil
}
