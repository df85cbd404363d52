package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// TxStore is a store with the transactional forms over transactions of
// type T (pgx.Tx, *sql.Tx).
type TxStore[T any] interface {
	store.Store
	store.TxStore[T]
}

// TxDatabase is a fresh database with a store on it and a business table
// the harness owns, so the suite can check that the caller's writes and the
// store's transitions commit together.
type TxDatabase[T any] struct {
	Store TxStore[T]
	// Write inserts the business row id inside tx.
	Write func(ctx context.Context, tx T, id string) error
	// Count counts the business rows id, outside any transaction.
	Count func(ctx context.Context, id string) (int, error)
}

// TxHarness tells RunTx how to get a transactional store.
type TxHarness[T any] struct {
	// NewDatabase creates a fresh database, its business table and a store
	// on it with the given clock, and registers their cleanup on t.
	NewDatabase func(t *testing.T, clock store.Clock) TxDatabase[T]
}

// RunTx runs the conformance suite of the transactional forms (InTx,
// ReserveTx, CompleteTx, CheckpointTx). Every SQL store runs it besides Run.
func RunTx[T any](t *testing.T, h TxHarness[T]) {
	t.Helper()
	if h.NewDatabase == nil {
		t.Fatal("storetest: TxHarness.NewDatabase is required")
	}
	t.Run("CommitTogether", func(t *testing.T) { testTxCommit(t, h) })
	t.Run("RollBackTogether", func(t *testing.T) { testTxRollback(t, h) })
	t.Run("ReserveTx", func(t *testing.T) { testReserveTx(t, h) })
	t.Run("WholeRequestInOneTx", func(t *testing.T) { testTxWhole(t, h) })
	t.Run("StaleFenceInTx", func(t *testing.T) { testTxStaleFence(t, h) })
	t.Run("InvalidParamsInTx", func(t *testing.T) { testTxInvalid(t, h) })
}

type txEnv[T any] struct {
	t     *testing.T
	db    TxDatabase[T]
	s     TxStore[T]
	clock *Clock
	ctx   context.Context
}

func newTxEnv[T any](t *testing.T, h TxHarness[T]) *txEnv[T] {
	t.Helper()
	t.Parallel()
	c := NewClock()
	db := h.NewDatabase(t, c.Now)
	return &txEnv[T]{t: t, db: db, s: db.Store, clock: c, ctx: context.Background()}
}

func (e *txEnv[T]) reserve(key string) store.Record {
	e.t.Helper()
	res, err := e.s.Reserve(e.ctx, reserveParams(key))
	if err != nil || res.Outcome != store.Created {
		e.t.Fatalf("Reserve(%s): %v %v", key, res.Outcome, err)
	}
	return res.Record
}

func reserveParams(key string) store.ReserveParams {
	return store.ReserveParams{Scope: "s", Key: key, Fingerprint: "fp", Lease: lease, TTL: ttl, LeasePolicy: store.LeaseUnknown}
}

func (e *txEnv[T]) get(key string) store.Record {
	e.t.Helper()
	r, err := e.s.Get(e.ctx, "s", key)
	if err != nil {
		e.t.Fatalf("Get(%s): %v", key, err)
	}
	return r
}

func (e *txEnv[T]) count(id string) int {
	e.t.Helper()
	n, err := e.db.Count(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Count(%s): %v", id, err)
	}
	return n
}

// pay is a phase of a handler: the business write, the recovery point and
// the completion in one transaction; fail makes the handler fail after
// them, so InTx must roll all three back.
func (e *txEnv[T]) pay(r store.Record, id string, fail error) error {
	resp := sampleResponse()
	return e.s.InTx(e.ctx, func(tx T) error {
		if err := e.db.Write(e.ctx, tx, id); err != nil {
			return err
		}
		if err := e.s.CheckpointTx(e.ctx, tx, store.CheckpointParams{FenceParams: fenceOf(r), RecoveryPoint: "charged"}); err != nil {
			return err
		}
		if err := e.s.CompleteTx(e.ctx, tx, store.CompleteParams{FenceParams: fenceOf(r), Response: resp}); err != nil {
			return err
		}
		return fail
	})
}

func testTxCommit[T any](t *testing.T, h TxHarness[T]) {
	e := newTxEnv(t, h)
	r := e.reserve("k")
	e.clock.Advance(time.Second)
	if err := e.pay(r, "pay_1", nil); err != nil {
		t.Fatal(err)
	}
	got := e.get("k")
	resp := sampleResponse()
	if got.State != store.StateCompleted || got.RecoveryPoint != "charged" || !sameResponse(got.Response, &resp) || got.Fence != r.Fence {
		t.Fatalf("after commit: %+v", got)
	}
	wantTime(t, "CompletedAt", got.CompletedAt, e.clock.Now())
	if n := e.count("pay_1"); n != 1 {
		t.Fatalf("after commit: %d business rows, want 1", n)
	}
}

func testTxRollback[T any](t *testing.T, h TxHarness[T]) {
	e := newTxEnv(t, h)
	r := e.reserve("k")
	boom := errors.New("handler failed after its writes")
	if err := e.pay(r, "pay_1", boom); !errors.Is(err, boom) {
		t.Fatalf("InTx: %v, want the handler's error", err)
	}
	got := e.get("k")
	if d := diffRecords(r, got); len(d) > 0 {
		t.Fatalf("a rolled-back transaction changed the record: %v", d)
	}
	if n := e.count("pay_1"); n != 0 {
		t.Fatalf("after rollback: %d business rows, want 0", n)
	}
	// The holder still holds the lease and can try again.
	if err := e.pay(r, "pay_1", nil); err != nil {
		t.Fatalf("second attempt: %v", err)
	}
	if got := e.get("k"); got.State != store.StateCompleted || e.count("pay_1") != 1 {
		t.Fatalf("after the second attempt: %s, %d business rows", got.State, e.count("pay_1"))
	}
}

func testReserveTx[T any](t *testing.T, h TxHarness[T]) {
	e := newTxEnv(t, h)
	boom := errors.New("rolled back")
	err := e.s.InTx(e.ctx, func(tx T) error {
		res, err := e.s.ReserveTx(e.ctx, tx, reserveParams("gone"))
		if err != nil || res.Outcome != store.Created || res.Record.Fence != e.clock.Now().UnixMicro() {
			t.Errorf("ReserveTx: %v fence %d %v", res.Outcome, res.Record.Fence, err)
		}
		// Inside the transaction the record is there.
		res, err = e.s.ReserveTx(e.ctx, tx, reserveParams("gone"))
		if err != nil || res.Outcome != store.Existing || res.Record.State != store.StateInProgress {
			t.Errorf("second ReserveTx in the transaction: %v %v", res.Outcome, err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v", err)
	}
	if _, err := e.s.Get(e.ctx, "s", "gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a reservation of a rolled-back transaction: %v, want ErrNotFound", err)
	}
	var kept store.Record
	if err := e.s.InTx(e.ctx, func(tx T) error {
		res, err := e.s.ReserveTx(e.ctx, tx, reserveParams("kept"))
		kept = res.Record
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := e.get("kept"); got.State != store.StateInProgress || got.Fence != kept.Fence {
		t.Fatalf("a committed ReserveTx: %+v", got)
	}
	// A record another handle changed since is read as it is now.
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(kept), Response: sampleResponse()}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.InTx(e.ctx, func(tx T) error {
		res, err := e.s.ReserveTx(e.ctx, tx, reserveParams("kept"))
		if err == nil && (res.Outcome != store.Existing || res.Record.State != store.StateCompleted) {
			t.Errorf("ReserveTx of a completed record: %v %s", res.Outcome, res.Record.State)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func testTxWhole[T any](t *testing.T, h TxHarness[T]) {
	e := newTxEnv(t, h)
	resp := sampleResponse()
	if err := e.s.InTx(e.ctx, func(tx T) error {
		res, err := e.s.ReserveTx(e.ctx, tx, reserveParams("k"))
		if err != nil {
			return err
		}
		if err := e.db.Write(e.ctx, tx, "pay_1"); err != nil {
			return err
		}
		if err := e.s.CheckpointTx(e.ctx, tx, store.CheckpointParams{FenceParams: fenceOf(res.Record), RecoveryPoint: "charged"}); err != nil {
			return err
		}
		return e.s.CompleteTx(e.ctx, tx, store.CompleteParams{FenceParams: fenceOf(res.Record), Response: resp})
	}); err != nil {
		t.Fatal(err)
	}
	if got := e.get("k"); got.State != store.StateCompleted || got.RecoveryPoint != "charged" || e.count("pay_1") != 1 {
		t.Fatalf("after one transaction: %s %q, %d business rows", got.State, got.RecoveryPoint, e.count("pay_1"))
	}
}

func testTxStaleFence[T any](t *testing.T, h TxHarness[T]) {
	e := newTxEnv(t, h)
	r := e.reserve("k")
	stale := fenceOf(r)
	stale.Fence++
	err := e.s.InTx(e.ctx, func(tx T) error {
		if err := e.db.Write(e.ctx, tx, "pay_1"); err != nil {
			return err
		}
		if err := e.s.CheckpointTx(e.ctx, tx, store.CheckpointParams{FenceParams: stale, RecoveryPoint: "x"}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("CheckpointTx with a stale fence: %v, want ErrLeaseLost", err)
		}
		return e.s.CompleteTx(e.ctx, tx, store.CompleteParams{FenceParams: stale, Response: sampleResponse()})
	})
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("CompleteTx with a stale fence: %v, want ErrLeaseLost", err)
	}
	if d := diffRecords(r, e.get("k")); len(d) > 0 || e.count("pay_1") != 0 {
		t.Fatalf("a lost lease committed something: fields %v, %d business rows", d, e.count("pay_1"))
	}
}

func testTxInvalid[T any](t *testing.T, h TxHarness[T]) {
	e := newTxEnv(t, h)
	r := e.reserve("k")
	zero := fenceOf(r)
	zero.Fence = 0
	_ = e.s.InTx(e.ctx, func(tx T) error {
		bad := reserveParams("")
		if _, err := e.s.ReserveTx(e.ctx, tx, bad); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("ReserveTx without a key: %v", err)
		}
		long := reserveParams(string(make([]byte, store.MaxKeyBytes+1)))
		if _, err := e.s.ReserveTx(e.ctx, tx, long); !errors.Is(err, store.ErrTooLong) {
			t.Errorf("ReserveTx with a key one byte too long: %v", err)
		}
		if err := e.s.CompleteTx(e.ctx, tx, store.CompleteParams{FenceParams: zero, Response: sampleResponse()}); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("CompleteTx with fence 0: %v", err)
		}
		if err := e.s.CheckpointTx(e.ctx, tx, store.CheckpointParams{FenceParams: zero}); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("CheckpointTx with fence 0: %v", err)
		}
		return nil
	})
	if d := diffRecords(r, e.get("k")); len(d) > 0 {
		t.Fatalf("refused operations changed the record: %v", d)
	}
}
