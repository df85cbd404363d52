package mysql

import (
	"context"
	"database/sql"
	"time"

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
//
// A capped ReserveTx runs the same steps in the caller's transaction,
// whose snapshot may predate the lock (REPEATABLE READ, the default): its
// count and its read of the key are locking reads, which see the latest
// rows. They keep the tenant's active records share-locked until that
// transaction ends, so a change of one of them (its holder's Complete)
// waits for it.

// reserveCapped is a capped Reserve in a transaction of its own.
func (s *Store) reserveCapped(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	tx, err := s.q.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return store.ReserveResult{}, err
	}
	res, err := s.reserveCappedIn(ctx, tx, p, qTenantCheck)
	if err != nil {
		_ = tx.Rollback()
		return store.ReserveResult{}, err
	}
	return res, tx.Commit()
}

// reserveCappedIn is a capped Reserve on q, a transaction, checked by
// check: qTenantCheck in the store's own transaction, qTenantCheckLocked in
// a caller's.
func (s *Store) reserveCappedIn(ctx context.Context, q querier, p store.ReserveParams, check *query) (store.ReserveResult, error) {
	a := s.reserveArgs(p)
	if err := lockTenant(ctx, q, a); err != nil {
		return store.ReserveResult{}, err
	}
	// One instant for the check and the write: with the server's clock each
	// statement would read its own, and a record expiring between them would
	// count as live in the check and be replaced by the write, one active
	// record past the cap.
	now, err := s.instant(ctx, q)
	if err != nil {
		return store.ReserveResult{}, err
	}
	a["now"] = now.Format(datetimeLayout)
	active, activates, err := checkTenant(ctx, q, check, a)
	if err != nil {
		return store.ReserveResult{}, err
	}
	if activates && active >= p.MaxActive {
		return store.ReserveResult{}, store.ErrOverCap
	}
	return reserveWith(ctx, q, a)
}

// instant reads the store's instant once: the injected clock's, or the
// server's, in UTC.
func (s *Store) instant(ctx context.Context, q querier) (time.Time, error) {
	a, err := qPendingNow.bind(args{"now": s.nowArg()})
	if err != nil {
		return time.Time{}, err
	}
	var now dbTime
	if err := q.QueryRowContext(ctx, qPendingNow.sql, a...).Scan(&now); err != nil {
		return time.Time{}, err
	}
	return now.t.UTC(), nil
}

// lockTenant locks the tenant's row of idem_tenants until the end of the
// transaction q. a are reserveArgs.
func lockTenant(ctx context.Context, q querier, a args) error {
	lock, err := qTenantLock.bind(a)
	if err != nil {
		return err
	}
	_, err = q.ExecContext(ctx, qTenantLock.sql, lock...)
	return err
}

// checkTenant counts the tenant's active records and reports whether the
// reservation of a (reserveArgs) would make one more active, with
// qTenantCheck or qTenantCheckLocked. Run it once the tenant's lock is
// held, for a count current as of the write.
func checkTenant(ctx context.Context, q querier, check *query, a args) (active int, activates bool, err error) {
	bound, err := check.bind(a)
	if err != nil {
		return 0, false, err
	}
	err = q.QueryRowContext(ctx, check.sql, bound...).Scan(&active, &activates)
	return active, activates, err
}

// CountActive implements [store.ActiveCounter].
func (s *Store) CountActive(ctx context.Context, limit int) (int, error) {
	if err := store.CheckActiveLimit(limit); err != nil {
		return 0, err
	}
	a, err := qCountActive.bind(args{"limit": limit})
	if err != nil {
		return 0, wrap("count active", err)
	}
	var n int
	if err := s.q.QueryRowContext(ctx, qCountActive.sql, a...).Scan(&n); err != nil {
		return 0, wrap("count active", err)
	}
	return n, nil
}
