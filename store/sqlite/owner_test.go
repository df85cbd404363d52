package sqlite_test

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
)

// A record written before migration 011 has no owner: once the migration
// adds the column it reads as Owner 0, the rest of it unchanged, and the
// next execution stores its Reserve's Owner.
func TestOwnerOfRecordsBeforeMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	clock := storetest.NewClock()
	s, err := sqlite.Open(ctx, path, sqlite.Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := reserveP("k", "fp", store.LeaseRetry)
	p.Owner = 5
	before := mustReserve(t, s, p, store.Created)
	// Back to the schema before migration 011.
	for _, q := range []string{
		`ALTER TABLE idem_records DROP COLUMN owner`,
		`DELETE FROM idem_migrations WHERE version = 11`,
	} {
		if _, err := s.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, path, sqlite.Config{Clock: clock.Now})
	got, err := s.Get(ctx, "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	want := before
	want.Owner = 0
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("the record across migration 011:\nbefore %+v\nafter  %+v", want, got)
	}
	clock.Advance(p.Lease)
	p.Owner = 6
	if took := mustReserve(t, s, p, store.TakenOver); took.Owner != 6 {
		t.Fatalf("takeover after the migration: Owner %d, want 6", took.Owner)
	}
}

// A pending record that replaces an expired one keeps no Owner of the
// execution before, nor does the worker's claim give it one.
func TestOwnerOfPendingReplacement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := storetest.NewClock()
	s := open(t, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{Clock: clock.Now})
	p := reserveP("k", "fp", store.LeaseUnknown)
	p.Owner = 5
	r := mustReserve(t, s, p, store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fenceOf(r), Response: store.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(p.TTL)
	res, err := s.ReservePending(ctx, store.PendingParams{ReserveParams: p,
		Request: store.PendingRequest{Queue: "q", Method: "POST", Target: "/"}})
	if err != nil || res.Outcome != store.Created || res.Record.Owner != 0 {
		t.Fatalf("pending over an expired record: %v, Owner %d, %v", res.Outcome, res.Record.Owner, err)
	}
	claimed, err := s.Claim(ctx, store.ClaimParams{Queue: "q", Limit: 1, Lease: time.Minute})
	if err != nil || len(claimed) != 1 || claimed[0].Owner != 0 {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
}
