package storekit_test

import (
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// A page that holds every row left has no next page (List's cursor is nil
// when the page is the last); a page cut short has one, at the last record
// it keeps.
func TestPage(t *testing.T) {
	rows := []store.Record{{Key: "a"}, {Key: "b"}, {Key: "c"}}
	for limit, want := range map[int]*store.Cursor{
		2: {Key: "b"},
		3: nil,
		4: nil,
	} {
		page, next := storekit.Page(rows, limit)
		if n := min(limit, len(rows)); len(page) != n || page[n-1].Key != rows[n-1].Key {
			t.Errorf("Page(3 rows, %d) kept %d rows", limit, len(page))
		}
		if (next == nil) != (want == nil) || next != nil && *next != *want {
			t.Errorf("Page(3 rows, %d): next %+v, want %+v", limit, next, want)
		}
	}
}

// Records of one instant come out by scope, then key, whatever order the
// store returned them in, so that every store orders a batch the same way.
func TestSortRecordsTies(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	rs := []store.Record{
		{Scope: "s2", Key: "a", CreatedAt: at},
		{Scope: "s1", Key: "b", CreatedAt: at},
		{Scope: "s3", Key: "z", CreatedAt: at.Add(-time.Second)},
		{Scope: "s1", Key: "a", CreatedAt: at},
	}
	storekit.SortRecords(rs, storekit.ByCreated)
	var got []string
	for _, r := range rs {
		got = append(got, r.Scope+"/"+r.Key)
	}
	if want := []string{"s3/z", "s1/a", "s1/b", "s2/a"}; !slices.Equal(got, want) {
		t.Errorf("sorted %v, want %v", got, want)
	}
}
