package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
)

// waitGroupQueue waits until the writer group has the given free slots and
// pending calls.
func waitGroupQueue(t *testing.T, s *sqlite.Store, free, pending int) {
	t.Helper()
	for i := 0; ; i++ {
		f, p := s.GroupQueue()
		if f == free && p == pending {
			return
		}
		if i == 10000 {
			t.Fatalf("group queue: %d free, %d pending; want %d, %d", f, p, free, pending)
		}
		time.Sleep(time.Millisecond)
	}
}

// holdWriter begins a transaction on the writer's only connection and
// starts a Reserve that takes the group's slot and waits for that
// connection. The returned function ends the transaction and waits for
// that Reserve.
func holdWriter(t *testing.T, s *sqlite.Store, key string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, reserveP(key, "fp", store.LeaseRetry))
		done <- err
	}()
	waitGroupQueue(t, s, 0, 0)
	return func() {
		t.Helper()
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Errorf("reserve %s: %v", key, err)
		}
	}
}

func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
	// A trigger fails one key's insert: only that call's savepoint rolls
	// back.
	if _, err := s.DB().ExecContext(ctx, `CREATE TRIGGER poison BEFORE INSERT ON idem_records
		WHEN NEW.key = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned key'); END`); err != nil {
		t.Fatal(err)
	}

	const n = 10
	release := holdWriter(t, s, "blocker1")
	var wg sync.WaitGroup
	recs := make([]store.Record, n)
	errs := make([]error, n+1)
	for i := range n {
		wg.Go(func() {
			var res store.ReserveResult
			res, errs[i] = s.Reserve(ctx, reserveP(fmt.Sprint("k", i), "fp", store.LeaseRetry))
			if errs[i] == nil && res.Outcome != store.Created {
				errs[i] = fmt.Errorf("outcome %v", res.Outcome)
			}
			recs[i] = res.Record
		})
		waitGroupQueue(t, s, 0, i+1)
	}
	wg.Go(func() { _, errs[n] = s.Reserve(ctx, reserveP("poison", "fp", store.LeaseRetry)) })
	waitGroupQueue(t, s, 0, n+1)
	release()
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("reserve k%d: %v", i, errs[i])
		}
	}
	if errs[n] == nil || !strings.Contains(errs[n].Error(), "poisoned key") {
		t.Errorf("poisoned reserve: %v, want the trigger's error", errs[n])
	}
	if _, err := s.Get(ctx, "s", "poison"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("poisoned key: %v, want ErrNotFound", err)
	}
	if got := s.GroupBatched(); got != n+1 {
		t.Errorf("batched %d calls, want %d", got, n+1)
	}

	// Completes share a transaction too; a stale fence loses its lease
	// without disturbing the others.
	release = holdWriter(t, s, "blocker2")
	for i := range n {
		wg.Go(func() {
			errs[i] = s.Complete(ctx, store.CompleteParams{FenceParams: fenceOf(recs[i]),
				Response: store.Response{Status: 201, Body: []byte(recs[i].Key)}, TTL: time.Hour})
		})
		waitGroupQueue(t, s, 0, i+1)
	}
	stale := fenceOf(recs[0])
	stale.Fence++
	wg.Go(func() {
		errs[n] = s.Complete(ctx, store.CompleteParams{FenceParams: stale, Response: store.Response{Status: 500}})
	})
	waitGroupQueue(t, s, 0, n+1)
	release()
	wg.Wait()
	for i := range n {
		rec, err := s.Get(ctx, "s", recs[i].Key)
		if errs[i] != nil || err != nil || rec.State != store.StateCompleted || string(rec.Response.Body) != recs[i].Key {
			t.Errorf("complete %s: %v; get: %+v, %v", recs[i].Key, errs[i], rec, err)
		}
	}
	if !errors.Is(errs[n], store.ErrLeaseLost) {
		t.Errorf("stale complete: %v, want ErrLeaseLost", errs[n])
	}
	if got := s.GroupBatched(); got != 2*(n+1) {
		t.Errorf("batched %d calls, want %d", got, 2*(n+1))
	}
	waitGroupQueue(t, s, 1, 0)
}
