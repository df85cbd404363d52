package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
)

// querier is what *sql.DB, *sql.Tx and prepared share: the operations run
// on any of them, so a method and its Tx form are one implementation.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// The driver keeps no statement cache, and parsing and planning cost about
// as much as running one of these statements (a Get takes half the time
// prepared), so each pool prepares the statements it runs once.
var (
	writerQueries = []string{
		qGet, qCreate, qReclaim, qTakeOver, qLeaseExpired,
		qComplete, qRelease, qMarkUnknown, qCheckpoint, qExtend,
		qDelete, qState, qSweep, qReapDelete, qReapSoft, qReapAbandon,
		qResolve, qDefer, qDeadLetter, qActive,
	}
	readerQueries = []string{qGet, qGetWithRequest, qListUnknownDue, qListUnknownAll}
)

// statements holds one pool's prepared statements by query text.
type statements struct {
	db *sql.DB
	m  atomic.Pointer[map[string]*sql.Stmt] // nil until prepared
}

// prepare prepares the queries once. It runs after migrations: before, the
// table they name may not exist. Until it succeeds, queries run unprepared.
// No lock is held while preparing: preparing waits for the writer's one
// connection, which a running transaction may hold.
func (st *statements) prepare(ctx context.Context, queries []string) error {
	if st.m.Load() != nil {
		return nil
	}
	m := make(map[string]*sql.Stmt, len(queries))
	for _, q := range queries {
		ps, err := st.db.PrepareContext(ctx, q)
		if err != nil {
			closeAll(m)
			return err
		}
		m[q] = ps
	}
	if !st.m.CompareAndSwap(nil, &m) {
		closeAll(m) // prepared concurrently by someone else
	}
	return nil
}

func (st *statements) get(query string) *sql.Stmt {
	if m := st.m.Load(); m != nil {
		return (*m)[query]
	}
	return nil
}

func (st *statements) close() error {
	if m := st.m.Swap(nil); m != nil {
		return closeAll(*m)
	}
	return nil
}

func closeAll(m map[string]*sql.Stmt) error {
	var errs []error
	for _, ps := range m {
		errs = append(errs, ps.Close())
	}
	return errors.Join(errs...)
}

// prepared is a querier that runs the prepared form of a query when there
// is one: on the pool, or inside tx, a transaction begun on that pool.
type prepared struct {
	st *statements
	tx *sql.Tx // nil outside a transaction
}

func (p prepared) stmt(ctx context.Context, query string) *sql.Stmt {
	ps := p.st.get(query)
	if ps != nil && p.tx != nil {
		return p.tx.StmtContext(ctx, ps)
	}
	return ps
}

func (p prepared) text() querier {
	if p.tx != nil {
		return p.tx
	}
	return p.st.db
}

func (p prepared) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if ps := p.stmt(ctx, query); ps != nil {
		return ps.ExecContext(ctx, args...)
	}
	return p.text().ExecContext(ctx, query, args...)
}

func (p prepared) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if ps := p.stmt(ctx, query); ps != nil {
		return ps.QueryContext(ctx, args...)
	}
	return p.text().QueryContext(ctx, query, args...)
}

func (p prepared) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if ps := p.stmt(ctx, query); ps != nil {
		return ps.QueryRowContext(ctx, args...)
	}
	return p.text().QueryRowContext(ctx, query, args...)
}
