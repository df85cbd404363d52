package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// TestListParamsValidate: a listing's filters are accepted up to the
// contract's limits of a scope and a key, and refused one byte over them,
// or when they hold bytes no record can hold (invalid UTF-8, a NUL
// anywhere, the first byte included), before any store reads.
func TestListParamsValidate(t *testing.T) {
	after := &store.Cursor{CreatedAt: time.Unix(1, 0), Scope: "s", Key: "k"}
	for name, c := range map[string]struct {
		p    store.ListParams
		want error
	}{
		"a page":                  {store.ListParams{Limit: 1}, nil},
		"the largest page":        {store.ListParams{Limit: store.MaxListLimit}, nil},
		"a prefix at the limit":   {store.ListParams{Limit: 1, ScopePrefix: strings.Repeat("s", store.MaxScopeBytes)}, nil},
		"a key at the limit":      {store.ListParams{Limit: 1, Key: strings.Repeat("k", store.MaxKeyBytes)}, nil},
		"after a cursor":          {store.ListParams{Limit: 1, After: after}, nil},
		"a prefix over the limit": {store.ListParams{Limit: 1, ScopePrefix: strings.Repeat("s", store.MaxScopeBytes+1)}, store.ErrTooLong},
		"a key over the limit":    {store.ListParams{Limit: 1, Key: strings.Repeat("k", store.MaxKeyBytes+1)}, store.ErrTooLong},
		"a key starting with NUL": {store.ListParams{Limit: 1, Key: "\x00k"}, store.ErrInvalidParams},
		"a prefix of a NUL":       {store.ListParams{Limit: 1, ScopePrefix: "\x00"}, store.ErrInvalidParams},
		"a key not UTF-8":         {store.ListParams{Limit: 1, Key: "k\xc3"}, store.ErrInvalidParams},
	} {
		err := c.p.Validate()
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
