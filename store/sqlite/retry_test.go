package sqlite_test

import (
	"context"
	"fmt"
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
	if err := s.Delete(ctx, store.DeleteParams{Scope: "s", Key: "missing"}); store.IsRetryable(err) {
		t.Fatalf("Delete of a missing record: %v is retryable", err)
	}
}

// TestBusyBatchFailsOnce: calls queued behind another process's write
// lock run as one batch, and when that batch waits out the busy timeout
// they all fail with it, as retryable. They are not run again one by one,
// which would make the last of them wait the busy timeout once for every
// call ahead of it.
func TestBusyBatchFailsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	const busy, queued = 300 * time.Millisecond, 8
	s := open(t, path, sqlite.Config{BusyTimeout: busy})
	holder := open(t, path, sqlite.Config{})
	tx, err := holder.DB().BeginTx(ctx, nil) // immediate: takes the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	first := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, reserveP("first", "fp", store.LeaseUnknown))
		first <- err
	}()
	waitGroupQueue(t, s, 0, 0)
	began := time.Now()
	errs := make(chan error, queued)
	for i := range queued {
		go func() {
			_, err := s.Reserve(ctx, reserveP(fmt.Sprint("k", i), "fp", store.LeaseUnknown))
			errs <- err
		}()
	}
	for range queued {
		if err := <-errs; !store.IsRetryable(err) {
			t.Errorf("a queued Reserve: %v, want a retryable error", err)
		}
	}
	// The lone call's busy timeout, then the batch's: not one for each.
	if took := time.Since(began); took > 4*busy {
		t.Errorf("the queued calls took %s to fail; the busy timeout is %s", took, busy)
	}
	if err := <-first; !store.IsRetryable(err) {
		t.Errorf("the first Reserve: %v, want a retryable error", err)
	}
}
