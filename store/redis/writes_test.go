package redis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// pending queues an asynchronous request under key on s.
func pending(t *testing.T, s *Store, key string) {
	t.Helper()
	p := store.PendingParams{ReserveParams: reserveParams(key), Request: store.PendingRequest{Queue: "q", Method: "POST", Target: "/pay"}}
	if _, err := s.ReservePending(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// TestWaitReplicasOnEveryWrite: with Config.WaitReplicas every write of a
// record waits for the replicas, the maintenance's batches and Delete too;
// on a server without replicas each fails, retryable, where it used to
// succeed unprotected (a failover could undo a claim, and a second worker
// run the request again).
func TestWaitReplicasOnEveryWrite(t *testing.T) {
	t.Parallel()
	client, prefix := hookedClient(t)
	clock := storetest.NewClock()
	plain, err := New(client, Config{Prefix: prefix, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := New(client, Config{Prefix: prefix, Clock: clock.Now, WaitReplicas: 1, WaitTimeout: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	complete := func(key string) store.Record {
		r := mustReserve(t, plain, reserveParams(key), store.Created)
		if err := plain.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence}, Response: store.Response{Status: 201}, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	pending(t, plain, "queued")
	mustReserve(t, plain, reserveParams("zombie"), store.Created)
	complete("expired")
	clock.Advance(48 * time.Hour) // the zombie's lease and expiry, the completed record's expiry, passed
	kept := complete("kept")
	for _, w := range []struct {
		name  string
		write func() error
	}{
		{"Claim", func() error {
			_, err := waiting.Claim(ctx, store.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute})
			return err
		}},
		{"SweepExpiredLeases", func() error {
			_, err := waiting.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10})
			return err
		}},
		{"Reap", func() error {
			_, err := waiting.Reap(ctx, store.ReapParams{Limit: 10, Abandoned: store.Response{Status: 504}, AbandonedTTL: time.Hour})
			return err
		}},
		{"Delete", func() error { return waiting.Delete(ctx, store.DeleteParams{Scope: kept.Scope, Key: kept.Key}) }},
	} {
		if err := w.write(); err == nil || !store.IsRetryable(err) {
			t.Errorf("%s with WaitReplicas 1 and no replica: %v, want a retryable failure", w.name, err)
		}
	}
}

// failLastClaim fails the last reply of a pipeline of Claim's scripts
// after the server ran them all: one master of a cluster timing out while
// the others answered.
type failLastClaim struct{ armed atomic.Bool }

func (h *failLastClaim) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *failLastClaim) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *failLastClaim) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		last := cmds[len(cmds)-1]
		if args := last.Args(); len(args) > 1 && fmt.Sprint(args[1]) == scriptClaim.Hash() && h.armed.CompareAndSwap(true, false) {
			last.SetErr(errors.New("i/o timeout (injected)"))
		}
		return err
	}
}

// TestClaimReturnsWhatItClaimedBeforeAFailure: Claim's calls go to each
// shard's master; when one fails, the records the others claimed are
// returned with the failure, for the caller to run, instead of being left
// in progress with no worker.
func TestClaimReturnsWhatItClaimedBeforeAFailure(t *testing.T) {
	t.Parallel()
	hook := &failLastClaim{}
	client, prefix := hookedClient(t, hook)
	s, err := New(client, Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := 0; len(keys) < 2; i++ { // two records in two shards
		k := fmt.Sprint("k", i)
		if len(keys) == 1 && shardOf("tenant POST /pay", k) == shardOf("tenant POST /pay", keys[0]) {
			continue
		}
		pending(t, s, k)
		keys = append(keys, k)
	}
	hook.armed.Store(true)
	claimed, err := s.Claim(ctx, store.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute})
	if err == nil {
		t.Fatal("the injected failure was not reported")
	}
	if len(claimed) != 1 {
		t.Fatalf("Claim returned %d records with its failure, want the 1 its other call claimed", len(claimed))
	}
	if r, err := s.Get(ctx, claimed[0].Scope, claimed[0].Key); err != nil || r.State != store.StateInProgress || r.Fence != claimed[0].Fence {
		t.Fatalf("returned record: %v %v", r.State, err)
	}
}
