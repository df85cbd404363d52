package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
)

// TestBusyIsRetryable holds the write lock from another handle on the file
// (another process would do the same) past the busy timeout: the write
// fails as retryable, and succeeds once the lock is released.
func TestBusyIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s := open(t, path, sqlite.Config{BusyTimeout: time.Millisecond})
	holder := open(t, path, sqlite.Config{})
	tx, err := holder.DB().BeginTx(ctx, nil) // immediate: takes the write lock
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Reserve(ctx, reserveP("k", "fp", store.LeaseUnknown))
	if err == nil || !store.IsRetryable(err) {
		t.Fatalf("Reserve while another handle writes: %v, want a retryable error", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, reserveP("k", "fp", store.LeaseUnknown)); err != nil {
		t.Fatalf("Reserve once the lock is released: %v", err)
	}
	// Definite answers are not retryable.
	if err := s.Delete(ctx, "s", "missing"); store.IsRetryable(err) {
		t.Fatalf("Delete of a missing record: %v is retryable", err)
	}
}
