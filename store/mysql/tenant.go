package mysql

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/store"
)

// The tenant cap (store.ReserveParams.MaxActive). A capped reservation
// runs in a READ COMMITTED transaction of its own: it locks its tenant's
// row of idem_tenants, counts the tenant's active records (a fresh
// snapshot, taken once the lock is held, so it sees what the lock's
// previous holder committed), refuses with ErrOverCap when the
// reservation would make one more active at the cap, and otherwise runs
// the usual upsert and select. The lock makes the count and the write one
// step per tenant across every process sharing the database. It costs
// five round trips where an uncapped reservation costs one.

// reserveCapped is a capped Reserve in a transaction of its own.
func (s *Store) reserveCapped(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	tx, err := s.q.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return store.ReserveResult{}, err
	}
	res, err := s.reserveCappedIn(ctx, tx, p)
	if err != nil {
		_ = tx.Rollback()
		return store.ReserveResult{}, err
	}
	return res, tx.Commit()
}

// reserveCappedIn is a capped Reserve on q, a transaction. In a caller's
// transaction (ReserveTx) the count is only current under READ COMMITTED.
func (s *Store) reserveCappedIn(ctx context.Context, q querier, p store.ReserveParams) (store.ReserveResult, error) {
	a := s.reserveArgs(p)
	lock, err := qTenantLock.bind(a)
	if err != nil {
		return store.ReserveResult{}, err
	}
	check, err := qTenantCheck.bind(a)
	if err != nil {
		return store.ReserveResult{}, err
	}
	if _, err := q.ExecContext(ctx, qTenantLock.sql, lock...); err != nil {
		return store.ReserveResult{}, err
	}
	var active int64
	var activates bool
	if err := q.QueryRowContext(ctx, qTenantCheck.sql, check...).Scan(&active, &activates); err != nil {
		return store.ReserveResult{}, err
	}
	if activates && active >= int64(p.MaxActive) {
		return store.ReserveResult{}, store.ErrOverCap
	}
	return s.reserveIn(ctx, q, p)
}
