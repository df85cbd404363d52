package memory

import (
	"context"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// List implements store.Store by a full scan under the lock: the memory
// store is for tests and small services.
func (s *Store) List(ctx context.Context, p store.ListParams) ([]store.Record, *store.Cursor, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	all := make([]store.Record, 0, s.count())
	for e := range s.all(true) {
		if r := e.record(); storekit.Match(&p, &r) {
			all = append(all, r)
		}
	}
	s.mu.Unlock()
	recs, next := storekit.Select(all, p)
	return recs, next, nil
}
