package store_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-go/idem/store"
	"pgregory.net/rapid"
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
		{"nul after non-ASCII", "s", "\u00e9\x00", false},
		{"invalid utf8 after ASCII", "scope", "key\xc3", false},
		{"surrogate half", "s", "\xed\xa0\x80", false},
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
	if err := store.CheckID("t\x1fPOST /v1/caf\u00e9", "\U0001F600-1"); err != nil {
		t.Errorf("non-ASCII scope and key: %v", err)
	}
}

// TestCheckIDText: CheckID accepts a scope and key exactly when both are
// valid UTF-8 without NUL, whatever bytes they hold.
func TestCheckIDText(t *testing.T) {
	bytesGen := rapid.SliceOfN(rapid.SampledFrom([]byte{0, 'a', 0x7f, 0x80, 0xbf, 0xc3, 0xa9, 0xe2, 0x82, 0xac, 0xed, 0xa0, 0xf0, 0x9f, 0x98, 0xff}), 1, 12)
	rapid.Check(t, func(t *rapid.T) {
		scope, key := string(bytesGen.Draw(t, "scope")), string(bytesGen.Draw(t, "key"))
		want := utf8.ValidString(scope) && utf8.ValidString(key) && !strings.Contains(scope+key, "\x00")
		if err := store.CheckID(scope, key); (err == nil) != want {
			t.Fatalf("CheckID(%q, %q) = %v, want valid %v", scope, key, err, want)
		}
	})
}
