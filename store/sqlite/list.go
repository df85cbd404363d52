package sqlite

import (
	"context"
	"fmt"
	"strconv"

	"github.com/idem-go/idem/internal/listsql"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// TEXT compares with the BINARY collation (memcmp of UTF-8), the byte order
// of the contract, and substr/length count characters on both sides.
var listDialect = listsql.Dialect{
	Param:     func(n int) string { return "?" + strconv.Itoa(n) },
	HasPrefix: func(p string) string { return "substr(scope, 1, length(" + p + ")) = " + p },
	Key:       "key",
	Order:     []string{"created_at", "scope", "key"},
	Time:      func(c store.Cursor) any { return c.CreatedAt.UnixMicro() },
}

// List implements [store.Store]. Migration 004 indexes the list order and
// the key.
func (s *Store) List(ctx context.Context, p store.ListParams) ([]store.Record, *store.Cursor, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	q, args := listsql.Build(listDialect, "idem_records", recordColumns, p)
	recs, err := queryRecords(ctx, s.read(), q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("idem/sqlite: list: %w", err)
	}
	recs, next := storekit.Page(recs, p.Limit)
	return recs, next, nil
}
