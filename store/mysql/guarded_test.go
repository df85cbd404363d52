package mysql

import (
	"errors"
	"testing"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// TestGuardedMissExplainedByTheRowItMissed: a guarded statement that
// matches nothing is explained by the row as the statement found it, not
// by whatever another process committed between the miss and the read that
// explains it. Here a Delete of any execution finds no record; before its
// explanation runs, another process creates the key and completes it. The
// answer must hold at one instant: ErrNotFound (the statement's), or the
// completed record deleted. ErrStateConflict ("the record is in
// progress") holds at none.
func TestGuardedMissExplainedByTheRowItMissed(t *testing.T) {
	t.Parallel()
	cfg := newDatabase(t)
	clock := storetest.NewClock()
	other := openStore(t, cfg, clock.Now)
	p := reserveParams("late")
	ctx := t.Context()
	hook := &beforeCommand{match: []byte("SELECT state, fence FROM idem_records"), hook: func() {
		res, err := other.Reserve(ctx, p)
		if err == nil {
			err = other.Complete(ctx, store.CompleteParams{FenceParams: fence(res.Record), Response: okResponse("done")})
		}
		if err != nil {
			t.Errorf("the other process: %v", err)
		}
	}}
	hooked := cfg.Clone()
	hooked.Net = hook.net()
	s := openStore(t, hooked, clock.Now)

	err := s.Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key})
	if !hook.ran.Load() {
		t.Fatal("the miss was never explained: the other process did not run")
	}
	rec, getErr := other.Get(ctx, p.Scope, p.Key)
	switch {
	case err == nil && errors.Is(getErr, store.ErrNotFound):
	case errors.Is(err, store.ErrNotFound) && getErr == nil && rec.State == store.StateCompleted:
	default:
		t.Fatalf("Delete: %v; the record after it: %s %v", err, rec.State, getErr)
	}
}
