package storekit

import (
	"cmp"
	"slices"
	"strings"

	"github.com/idem-go/idem/store"
)

// Match reports whether r passes the filters of p (not the cursor), for
// stores that filter in Go.
func Match(p *store.ListParams, r *store.Record) bool {
	return strings.HasPrefix(r.Scope, p.ScopePrefix) &&
		(p.Key == "" || r.Key == p.Key) &&
		(p.State == "" || r.State == p.State)
}

// Takes reports whether r belongs to the listing p asks for: it passes the
// filters and lies after p.After.
func Takes(p *store.ListParams, r *store.Record) bool {
	return Match(p, r) && (p.After == nil || CompareList(*p.After, store.CursorOf(r)) < 0)
}

// CompareList orders records as List returns them: negative when a comes
// before b (newer, or the same instant and a greater scope, then key).
func CompareList(a, b store.Cursor) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Scope, a.Scope); c != 0 {
		return c
	}
	return cmp.Compare(b.Key, a.Key)
}

// Page cuts a page out of rows read with a limit of p.Limit+1, in list
// order: the extra row only says that there is a next page, whose cursor is
// the last record kept.
func Page(rows []store.Record, limit int) ([]store.Record, *store.Cursor) {
	if len(rows) <= limit {
		return rows, nil
	}
	rows = rows[:limit]
	c := store.CursorOf(&rows[limit-1])
	return rows, &c
}

// Select is List for stores that filter in Go: it keeps the
// records of all that match p and lie after p.After, sorts them in list
// order and cuts the page. all is reordered.
func Select(all []store.Record, p store.ListParams) ([]store.Record, *store.Cursor) {
	out := all[:0]
	for i := range all {
		r := &all[i]
		if Takes(&p, r) {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b store.Record) int { return CompareList(store.CursorOf(&a), store.CursorOf(&b)) })
	return Page(out, p.Limit)
}
