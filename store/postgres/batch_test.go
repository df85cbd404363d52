package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// TestConformanceBatched runs the store suite with every call on the
// batched path, alone or not, through the multi-row statements: they must
// keep every rule the single statements keep. It runs with the replay
// cache, which must keep them too.
func TestConformanceBatched(t *testing.T) {
	conformance(t, testURL(t), postgres.Config{ForceBatches: true, MaxConns: smallPool, TenantCap: true, ReplayCache: 1 << 20}, false)
}

// TestForceBatchesUsesTheMultiRowStatements checks that the forced path is
// the one the batched suite means to test: a lone Reserve and Complete each
// go as a multi-row statement.
func TestForceBatchesUsesTheMultiRowStatements(t *testing.T) {
	s, err := postgres.Open(t.Context(), testURL(t), postgres.Config{Schema: newSchema(t), ForceBatches: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := reserveParams("forced")
	res, err := s.Reserve(t.Context(), p)
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	if err := s.Complete(t.Context(), store.CompleteParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key,
		Fence: res.Record.Fence}, Response: okResponse()}); err != nil {
		t.Fatal(err)
	}
	if n := s.BatchMany(); n != 2 {
		t.Fatalf("%d multi-row statements for a lone Reserve and Complete, want 2", n)
	}
}

// openSchema opens a store with cfg on a new schema, closed at the end of
// the test.
func openSchema(t *testing.T, cfg postgres.Config) (*postgres.Store, string) {
	t.Helper()
	cfg.Schema = newSchema(t)
	s, err := postgres.Open(context.Background(), testURL(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, cfg.Schema
}

// holdSlot makes the store's only batch slot wait on a row lock: it locks
// the record of key from an outside transaction and starts a Complete of
// it. Calling the returned function releases the lock and waits for that
// Complete.
func holdSlot(t *testing.T, s *postgres.Store, schema, key string) (release func()) {
	t.Helper()
	s.HoldQueue()
	ctx := context.Background()
	res, err := s.Reserve(ctx, reserveParams(key))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := adminConn(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT FROM "+pgx.Identifier{schema, "idem_records"}.Sanitize()+
		" WHERE key = $1 FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.Complete(ctx, completeParams(key, res.Record.Fence))
	}()
	waitQueue(t, s, 0, 0)
	return func() {
		t.Helper()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Errorf("complete %s: %v", key, err)
		}
	}
}

// waitQueue waits until the batcher has free slots and pending calls.
func waitQueue(t *testing.T, s *postgres.Store, free, pending int) {
	t.Helper()
	for i := 0; ; i++ {
		f, p := s.BatchQueue()
		if f == free && p == pending {
			return
		}
		if i == 10000 {
			t.Fatalf("batch queue: %d free, %d pending; want %d, %d", f, p, free, pending)
		}
		time.Sleep(time.Millisecond)
	}
}

func completeParams(key string, fence int64) store.CompleteParams {
	return store.CompleteParams{
		FenceParams: store.FenceParams{Scope: reserveParams(key).Scope, Key: key, Fence: fence},
		Response:    store.Response{Status: 201, Body: []byte(key)},
		TTL:         time.Hour,
	}
}

func TestBatchGroupCommit(t *testing.T) {
	s, schema := openSchema(t, postgres.Config{MaxBatches: 1})
	ctx := context.Background()
	admin := adminConn(t)
	// A trigger that fails one key's insert: its statement error rolls back
	// the whole pipeline it rides in.
	fn := pgx.Identifier{schema, "poison"}.Sanitize()
	if _, err := admin.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.key = 'poison' THEN RAISE EXCEPTION 'poisoned key'; END IF; RETURN NEW; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE TRIGGER poison BEFORE INSERT ON `+
		pgx.Identifier{schema, "idem_records"}.Sanitize()+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
		t.Fatal(err)
	}

	const n = 10
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", n-i) // queued out of key order
	}

	// Reserves queued behind a busy slot leave as one pipeline; the poisoned
	// one rolls it back, and each then runs alone.
	release := holdSlot(t, s, schema, "blocker1")
	var wg sync.WaitGroup
	results := make([]store.ReserveResult, n)
	errs := make([]error, n+1)
	for i, k := range keys {
		wg.Go(func() { results[i], errs[i] = s.Reserve(ctx, reserveParams(k)) })
		waitQueue(t, s, 0, i+1)
	}
	wg.Go(func() { _, errs[n] = s.Reserve(ctx, reserveParams("poison")) })
	waitQueue(t, s, 0, n+1)
	release()
	wg.Wait()
	for i, k := range keys {
		if errs[i] != nil || results[i].Outcome != store.Created || results[i].Record.Key != k {
			t.Errorf("reserve %s: %+v, %v", k, results[i], errs[i])
		}
	}
	if errs[n] == nil || !strings.Contains(errs[n].Error(), "poisoned key") {
		t.Errorf("poisoned reserve: %v, want the trigger's error", errs[n])
	}
	if batched, rolledBack := s.BatchStats(); batched != n+1 || rolledBack != 1 {
		t.Errorf("batched %d calls, %d rolled back; want %d, 1", batched, rolledBack, n+1)
	}
	waitQueue(t, s, 1, 0)

	// Completes share one pipeline and one commit; a queued call whose
	// context ends leaves the queue.
	release = holdSlot(t, s, schema, "blocker2")
	cctx, cancel := context.WithCancel(ctx)
	canceled := make(chan error, 1)
	go func() {
		canceled <- s.Complete(cctx, completeParams(keys[0], results[0].Record.Fence))
	}()
	waitQueue(t, s, 0, 1)
	cancel()
	if err := <-canceled; !errors.Is(err, context.Canceled) {
		t.Errorf("canceled complete: %v", err)
	}
	waitQueue(t, s, 0, 0)
	for i, k := range keys {
		wg.Go(func() { errs[i] = s.Complete(ctx, completeParams(k, results[i].Record.Fence)) })
		waitQueue(t, s, 0, i+1)
	}
	stale := completeParams(keys[0], results[0].Record.Fence+1)
	wg.Go(func() { errs[n] = s.Complete(ctx, stale) })
	waitQueue(t, s, 0, n+1)
	release()
	wg.Wait()
	for i, k := range keys {
		if errs[i] != nil {
			t.Errorf("complete %s: %v", k, errs[i])
		}
		rec, err := s.Get(ctx, reserveParams(k).Scope, k)
		if err != nil || rec.State != store.StateCompleted || string(rec.Response.Body) != k {
			t.Errorf("get %s: %+v, %v", k, rec, err)
		}
	}
	if !errors.Is(errs[n], store.ErrLeaseLost) {
		t.Errorf("complete with a stale fence in a batch: %v, want ErrLeaseLost", errs[n])
	}
	if batched, rolledBack := s.BatchStats(); batched != 2*(n+1) || rolledBack != 1 {
		t.Errorf("batched %d calls, %d rolled back; want %d, 1", batched, rolledBack, 2*(n+1))
	}
	waitQueue(t, s, 1, 0)
}

func TestBatchingOff(t *testing.T) {
	s, _ := openSchema(t, postgres.Config{MaxBatches: -1})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			k := fmt.Sprint("k", i)
			res, err := s.Reserve(ctx, reserveParams(k))
			if err == nil {
				err = s.Complete(ctx, completeParams(k, res.Record.Fence))
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestOpenPoolSize(t *testing.T) {
	schema := newSchema(t)
	ctx := context.Background()
	for _, c := range []struct {
		query string
		cfg   int32
		want  int32
	}{
		{"", 0, postgres.DefaultMaxConns},
		{"&pool_max_conns=7", 0, 7},
		{"&pool_max_conns=7", 9, 9},
		{"", 3, 3},
	} {
		s, err := postgres.Open(ctx, testURL(t)+c.query, postgres.Config{Schema: schema, MaxConns: c.cfg})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Pool().Config().MaxConns; got != c.want {
			t.Errorf("url %q, MaxConns %d: pool of %d, want %d", c.query, c.cfg, got, c.want)
		}
		s.Close()
	}
	if _, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: schema, MaxConns: -1}); !errors.Is(err, store.ErrInvalidParams) {
		t.Errorf("negative MaxConns: %v", err)
	}
}

// lockKey reserves key inside an open transaction of another connection,
// whose uncommitted row makes any other insert of key wait. The returned
// function commits it.
func lockKey(t *testing.T, s *postgres.Store, key string) (commit func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := adminConn(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// On a failed test, end the transaction before the store closes
	// (cleanups run last first), so no call waits for it forever.
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := s.ReserveTx(ctx, tx, reserveParams(key)); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// awaitAll waits for the calls' results, failing when they are held up
// (a liveness bound, far above any batch's latency).
func awaitAll(t *testing.T, what string, done <-chan error, n int) {
	t.Helper()
	for range n {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: still waiting after 30s, held up by a lock on another key", what)
		}
	}
}

// A batch that waits for a row lock gives up (lock_timeout) and its calls
// run alone: the others are not held up by the one whose key a caller's
// open transaction holds.
func TestBatchLockWaitRunsAlone(t *testing.T) {
	s, schema := openSchema(t, postgres.Config{})
	ctx := context.Background()
	commit := lockKey(t, s, "locked")
	_, rolledBack := s.BatchStats()

	release := holdSlot(t, s, schema, "blocker")
	locked := make(chan store.ReserveResult, 1)
	go func() {
		res, err := s.Reserve(ctx, reserveParams("locked"))
		if err != nil {
			t.Errorf("reserve locked: %v", err)
		}
		locked <- res
	}()
	waitQueue(t, s, 0, 1)
	others := make(chan error, 2)
	for i, k := range []string{"a", "b"} {
		go func() {
			res, err := s.Reserve(ctx, reserveParams(k))
			if err == nil && res.Outcome != store.Created {
				err = fmt.Errorf("outcome %v", res.Outcome)
			}
			others <- err
		}()
		waitQueue(t, s, 0, i+2)
	}
	release()
	awaitAll(t, "reserves batched with a locked key", others, 2)
	if _, rb := s.BatchStats(); rb == rolledBack {
		t.Fatal("the batch that waited for the lock did not roll back")
	}
	select {
	case res := <-locked:
		t.Fatalf("the locked key's reserve returned %v while its row is uncommitted", res.Outcome)
	default:
	}
	commit()
	if res := <-locked; res.Outcome != store.Existing || res.Record.State != store.StateInProgress {
		t.Fatalf("locked key after the commit: %v %s, want the transaction's record in progress", res.Outcome, res.Record.State)
	}
}

// A lone call that waits for a row lock keeps the only slot; the calls
// queued behind it get an extra slot once the queue has not moved for a
// while.
func TestBatchStalledSlot(t *testing.T) {
	s, _ := openSchema(t, postgres.Config{})
	ctx := context.Background()
	commit := lockKey(t, s, "locked")
	locked := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, reserveParams("locked"))
		locked <- err
	}()
	waitQueue(t, s, 0, 0) // the lone call holds the slot, waiting for the lock
	others := make(chan error, 3)
	for _, k := range []string{"a", "b", "c"} {
		go func() {
			_, err := s.Reserve(ctx, reserveParams(k))
			others <- err
		}()
	}
	awaitAll(t, "reserves queued behind a call waiting for a lock", others, 3)
	if s.BatchStalls() == 0 {
		t.Fatal("no extra slot was opened")
	}
	commit()
	awaitAll(t, "the locked key's reserve", locked, 1)
}
