package mysql

import (
	"context"

	"github.com/idem-go/idem/internal/listsql"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// scope and key are VARBINARY: they compare as bytes, the contract's order.
// LOCATE(prefix, scope) = 1 is "starts with" taking one parameter, with no
// LIKE wildcards to escape. Migration 004 indexes created_at (InnoDB appends
// the primary key, so the index is in the full list order) and the key.
var listDialect = listsql.Dialect{
	Param:     func(int) string { return "?" },
	HasPrefix: func(p string) string { return "LOCATE(" + p + ", scope) = 1" },
	Key:       "`key`",
	Order:     []string{"created_at", "scope", "`key`"},
	Time:      func(c store.Cursor) any { return c.CreatedAt.UTC().Format(datetimeLayout) },
}

// List implements [store.Store.List].
func (s *Store) List(ctx context.Context, p store.ListParams) ([]store.Record, *store.Cursor, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	text, a := listsql.Build(listDialect, "idem_records", q("record_columns").sql, p)
	rows, err := s.q.QueryContext(ctx, text, a...)
	if err != nil {
		return nil, nil, wrap("list", err)
	}
	out, err := collect(rows, scanPlain)
	if err != nil {
		return nil, nil, wrap("list", err)
	}
	out, next := storekit.Page(out, p.Limit)
	return out, next, nil
}
