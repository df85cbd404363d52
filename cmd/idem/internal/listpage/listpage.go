// Package listpage reads one page of the records a store lists and a
// filter keeps, for listings that select on what only the record tells
// (an exact scope, a dead letter).
package listpage

import (
	"context"

	"github.com/idem-go/idem/store"
)

// Filtered lists the records p selects that keep accepts, up to p.Limit of
// them, reading the store's pages of perPage records (p.Limit when 0). The
// cursor it answers is that of the last record read, so the next page
// neither skips nor repeats a record; nil when the store has no more. With
// maxScan > 0 it stops once it has read that many records, answering the
// fewer it found and the cursor to go on from.
func Filtered(ctx context.Context, s store.Store, p store.ListParams, perPage, maxScan int,
	keep func(*store.Record) bool) ([]store.Record, *store.Cursor, error) {
	want := p.Limit
	if perPage > 0 {
		p.Limit = perPage
	}
	var out []store.Record
	for scanned := 0; ; {
		recs, next, err := s.List(ctx, p)
		if err != nil {
			return nil, nil, err
		}
		for i := range recs {
			if !keep(&recs[i]) {
				continue
			}
			out = append(out, recs[i])
			if len(out) == want {
				if i == len(recs)-1 && next == nil {
					return out, nil, nil
				}
				c := store.CursorOf(&recs[i])
				return out, &c, nil
			}
		}
		scanned += len(recs)
		if next == nil || (maxScan > 0 && scanned >= maxScan) {
			return out, next, nil
		}
		p.After = next
	}
}
