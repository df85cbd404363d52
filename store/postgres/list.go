package postgres

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/listsql"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// scope and key compare under COLLATE "C" (bytes), the contract's order,
// whatever the database's collation; migration 004 indexes that order.
var listDialect = listsql.Dialect{
	Param:     func(n int) string { return "$" + strconv.Itoa(n) },
	HasPrefix: func(p string) string { return "starts_with(scope, " + p + "::text)" },
	Key:       "key",
	Order:     []string{"created_at", `scope COLLATE "C"`, `key COLLATE "C"`},
	Time:      func(c store.Cursor) any { return c.CreatedAt },
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, p store.ListParams) ([]store.Record, *store.Cursor, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	table := "idem_records"
	if s.cfg.Schema != "" {
		table = pgx.Identifier{s.cfg.Schema, table}.Sanitize()
	}
	q, args := listsql.Build(listDialect, table, recordColumns, p)
	recs, err := s.queryIndexed(ctx, sqlNoSeqScan, q, args, collectRecords)
	if err != nil {
		return nil, nil, wrap(ctx, "list", err)
	}
	recs, next := storekit.Page(recs, p.Limit)
	return recs, next, nil
}
