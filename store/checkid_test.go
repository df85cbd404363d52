package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem/store"
)

func TestCheckID(t *testing.T) {
	long := strings.Repeat("s", store.MaxScopeBytes+1)
	for _, c := range []struct {
		name, scope, key string
		tooLong          bool
	}{
		{"empty scope", "", "k", false},
		{"empty key", "s", "", false},
		{"long scope", long, "k", true},
		{"long key", "s", strings.Repeat("k", store.MaxKeyBytes+1), true},
		{"invalid utf8 scope", "s\xff", "k", false},
		{"nul in key", "s", "k\x00", false},
	} {
		err := store.CheckID(c.scope, c.key)
		if !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("%s: %v, want ErrInvalidParams", c.name, err)
		}
		if errors.Is(err, store.ErrTooLong) != c.tooLong {
			t.Errorf("%s: %v, ErrTooLong want %v", c.name, err, c.tooLong)
		}
	}
	if err := store.CheckID(strings.Repeat("s", store.MaxScopeBytes), "k"); err != nil {
		t.Errorf("scope at the limit: %v", err)
	}
}
