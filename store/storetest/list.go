package storetest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// listFixture creates records in several scopes, keys and states, some at
// one instant (the order then falls to scope and key), and returns them as
// Get reads them, in list order.
func listFixture(e *env) []store.Record {
	e.t.Helper()
	type spec struct {
		scope, key string
		to         store.State
		sameTime   bool // created at the instant of the previous one
	}
	specs := []spec{
		{"t1|POST /a", "k1", store.StateCompleted, false},
		{"t1|POST /a", "k2", store.StateUnknown, false},
		{"t1|POST /b", "k1", store.StateFailedRetryable, false},
		{"t2|POST /a", "k1", store.StateInProgress, false},
		{"t2|POST /a", "k3", store.StateCompleted, true},
		{"t1|POST /a", "k3", store.StateUnknown, true},
		{"t1%|POST /a", "k1", store.StateCompleted, false},
		{"t1_|POST /a", "k1", store.StateCompleted, false},
		{"t3|POST /a", "k2", store.StateCompleted, false},
	}
	var out []store.Record
	for _, sp := range specs {
		if !sp.sameTime {
			e.clock.Advance(time.Millisecond)
		}
		r := e.create(sp.scope, sp.key, "fp", store.LeaseUnknown)
		switch sp.to {
		case store.StateCompleted:
			e.complete(r, sampleResponse())
		case store.StateUnknown:
			if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "timeout"}); err != nil {
				e.t.Fatal(err)
			}
		case store.StateFailedRetryable:
			if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "refused"}); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	for _, sp := range specs {
		out = append(out, e.get(sp.scope, sp.key))
	}
	slices.SortFunc(out, func(a, b store.Record) int { return storekit.CompareList(store.CursorOf(&a), store.CursorOf(&b)) })
	return out
}

// list pages through the whole listing with pages of size limit and checks
// that every page but the last is full and that the last has no cursor.
func (e *env) list(p store.ListParams) []store.Record {
	e.t.Helper()
	var all []store.Record
	for pages := 0; ; pages++ {
		if pages > 100 {
			e.t.Fatalf("List %+v: more than 100 pages", p)
		}
		recs, next, err := e.s.List(e.ctx, p)
		if err != nil {
			e.t.Fatalf("List %+v: %v", p, err)
		}
		all = append(all, recs...)
		if next == nil {
			return all
		}
		if len(recs) != p.Limit {
			e.t.Fatalf("List %+v: a page of %d records with a next cursor", p, len(recs))
		}
		if !sameCursor(*next, store.CursorOf(&recs[len(recs)-1])) {
			e.t.Fatalf("List: next cursor %+v is not the last record's position", *next)
		}
		p.After = next
	}
}

func sameCursor(a, b store.Cursor) bool {
	return a.CreatedAt.Equal(b.CreatedAt) && a.Scope == b.Scope && a.Key == b.Key
}

func filterRecords(all []store.Record, keep func(r *store.Record) bool) []store.Record {
	var out []store.Record
	for i := range all {
		if keep(&all[i]) {
			out = append(out, all[i])
		}
	}
	return out
}

func sameList(t *testing.T, what string, got, want []store.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records %v, want %d %v", what, len(got), idsOf(got), len(want), idsOf(want))
	}
	for i := range got {
		if d := diffRecords(got[i], want[i]); len(d) > 0 {
			t.Fatalf("%s: record %d is %s/%s, want %s/%s (differs in %v)", what, i,
				got[i].Scope, got[i].Key, want[i].Scope, want[i].Key, d)
		}
	}
}

func idsOf(rs []store.Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Scope + "/" + r.Key
	}
	return out
}

// testList: List returns whole records, newest first with scope and key
// breaking ties, filtered by scope prefix (taken literally: no wildcard),
// key and state, and pages of every size add up to the full list.
func testList(t *testing.T, h Harness) {
	e := newEnv(t, h)
	want := listFixture(e)

	for _, limit := range []int{1, 2, 3, len(want), len(want) + 1, store.MaxListLimit} {
		sameList(t, "full list", e.list(store.ListParams{Limit: limit}), want)
	}
	cases := []struct {
		name string
		p    store.ListParams
		keep func(r *store.Record) bool
	}{
		{"tenant t1", store.ListParams{ScopePrefix: "t1|"}, func(r *store.Record) bool { return strings.HasPrefix(r.Scope, "t1|") }},
		{"literal %", store.ListParams{ScopePrefix: "t1%"}, func(r *store.Record) bool { return r.Scope == "t1%|POST /a" }},
		{"literal _", store.ListParams{ScopePrefix: "t1_"}, func(r *store.Record) bool { return r.Scope == "t1_|POST /a" }},
		{"whole scope", store.ListParams{ScopePrefix: "t1|POST /a"}, func(r *store.Record) bool { return r.Scope == "t1|POST /a" }},
		{"key", store.ListParams{Key: "k1"}, func(r *store.Record) bool { return r.Key == "k1" }},
		{"state unknown", store.ListParams{State: store.StateUnknown}, func(r *store.Record) bool { return r.State == store.StateUnknown }},
		{"state in_progress", store.ListParams{State: store.StateInProgress}, func(r *store.Record) bool { return r.State == store.StateInProgress }},
		{"all filters", store.ListParams{ScopePrefix: "t1", Key: "k3", State: store.StateUnknown},
			func(r *store.Record) bool {
				return r.Key == "k3" && r.State == store.StateUnknown && strings.HasPrefix(r.Scope, "t1")
			}},
		{"no match", store.ListParams{ScopePrefix: "t9"}, func(*store.Record) bool { return false }},
		{"key prefix is not a key", store.ListParams{Key: "k"}, func(*store.Record) bool { return false }},
	}
	for _, c := range cases {
		w := filterRecords(want, c.keep)
		for _, limit := range []int{1, 2, 100} {
			p := c.p
			p.Limit = limit
			sameList(t, c.name, e.list(p), w)
		}
	}

	// A cursor is a position, not a record: it works after its record is
	// gone, and a record created after the first page sorts before the
	// cursor, so it never shows up on a later page.
	first, next, err := e.s.List(e.ctx, store.ListParams{Limit: 3})
	if err != nil || next == nil {
		t.Fatalf("first page: %v, next %v", err, next)
	}
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: first[2].Scope, Key: first[2].Key}); err != nil && first[2].State != store.StateInProgress {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	e.create("t1|POST /a", "late", "fp", store.LeaseUnknown)
	rest, _, err := e.s.List(e.ctx, store.ListParams{Limit: 100, After: next})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "after a cursor whose record was deleted", rest, want[3:])

	// Cursors survive their text form.
	c, err := store.ParseCursor(next.String())
	if err != nil || !sameCursor(c, *next) {
		t.Fatalf("ParseCursor(%q) = %+v, %v; want %+v", next.String(), c, err, *next)
	}
}

// testListInvalid: bad parameters are refused with ErrInvalidParams.
func testListInvalid(t *testing.T, h Harness) {
	e := newEnv(t, h)
	now := e.clock.Now()
	for name, p := range map[string]store.ListParams{
		"zero limit":          {},
		"negative limit":      {Limit: -1},
		"limit over the max":  {Limit: store.MaxListLimit + 1},
		"unknown state":       {Limit: 1, State: "done"},
		"long prefix":         {Limit: 1, ScopePrefix: strings.Repeat("s", store.MaxScopeBytes+1)},
		"long key":            {Limit: 1, Key: strings.Repeat("k", store.MaxKeyBytes+1)},
		"NUL in key":          {Limit: 1, Key: "a\x00b"},
		"invalid UTF-8":       {Limit: 1, ScopePrefix: "\xff"},
		"cursor without id":   {Limit: 1, After: &store.Cursor{CreatedAt: now}},
		"cursor without time": {Limit: 1, After: &store.Cursor{Scope: "s", Key: "k"}},
	} {
		if _, _, err := e.s.List(e.ctx, p); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("List with %s: %v, want ErrInvalidParams", name, err)
		}
	}
	for _, s := range []string{"", "1.2", "x.YQ.YQ", "0.YQ.YQ", "1.!.YQ", "1..YQ"} {
		if _, err := store.ParseCursor(s); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("ParseCursor(%q): %v, want ErrInvalidParams", s, err)
		}
	}
}
