package store_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem/store"
)

func TestReplayableHeader(t *testing.T) {
	h := http.Header{
		"Content-Type":   {"application/json"},
		"X-Request-Id":   {"abc"},
		"Set-Cookie":     {"s=1"},
		"Date":           {"Mon"},
		"Content-Length": {"3"},
		"Connection":     {"close, X-Private"},
		"X-Private":      {"secret"},
		"X-Bell":         {"a\x07b"},
		"X-Del":          {"a\x7f"},
		"X-Tab":          {"a\tb"},
		"Bad Name":       {"v"},
	}
	got := store.ReplayableHeader(h)
	for _, k := range []string{"Content-Type", "X-Request-Id", "X-Tab"} {
		if got.Get(k) == "" {
			t.Errorf("%s dropped", k)
		}
	}
	for _, k := range []string{"Set-Cookie", "Date", "Content-Length", "Connection", "X-Private", "X-Bell", "X-Del", "Bad Name"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s kept", k)
		}
	}
	got.Add("X-Request-Id", "more")
	if len(h["X-Request-Id"]) != 1 {
		t.Error("an Add on the copy wrote into the original")
	}
	if store.ReplayableHeader(nil) != nil {
		t.Error("nil header: want nil")
	}
}

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
