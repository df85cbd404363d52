package sqlite_test

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"

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
	s := open(t, path, sqlite.Config{Clock: clock.Now}) // closed below; the cleanup closes it again, harmlessly
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
