package listpage_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/listpage"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// twenty returns a store of twenty records k00..k19, created a second
// apart, so that the list order (newest first) is k19..k00.
func twenty(t *testing.T) store.Store {
	t.Helper()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := memory.New(memory.Config{Clock: func() time.Time { return now }})
	for i := range 20 {
		if _, err := s.Reserve(context.Background(), store.ReserveParams{
			Scope: "s", Key: fmt.Sprintf("k%02d", i), Fingerprint: "fp",
			Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown,
		}); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	return s
}

func even(r *store.Record) bool {
	n, _ := strconv.Atoi(r.Key[1:])
	return n%2 == 0
}

// Paging to the end yields every kept record once, in list order, whatever
// the store's page size.
func TestFilteredPages(t *testing.T) {
	s := twenty(t)
	for _, perPage := range []int{0, 1, 4, 7, 100} {
		var got []string
		p := store.ListParams{Limit: 3}
		for range 20 {
			recs, next, err := listpage.Filtered(context.Background(), s, p, perPage, 0, even)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) > 3 {
				t.Fatalf("perPage %d: a page of %d records, want at most 3", perPage, len(recs))
			}
			for _, r := range recs {
				got = append(got, r.Key)
			}
			if next == nil {
				break
			}
			p.After = next
		}
		want := []string{"k18", "k16", "k14", "k12", "k10", "k08", "k06", "k04", "k02", "k00"}
		if !slices.Equal(got, want) {
			t.Errorf("perPage %d: %v, want %v", perPage, got, want)
		}
	}
}

// With maxScan, a page stops after reading that many records and answers
// the cursor to go on from.
func TestFilteredMaxScan(t *testing.T) {
	s := twenty(t)
	none := func(*store.Record) bool { return false }
	recs, next, err := listpage.Filtered(context.Background(), s, store.ListParams{Limit: 3}, 5, 10, none)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 0 || next == nil || next.Key != "k10" {
		t.Fatalf("%d records, cursor %+v; want none and the cursor after the tenth record read (k10)", len(recs), next)
	}
}
