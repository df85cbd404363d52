package memory

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// TestScopeDroppedWithItsLastRecord checks that a scope whose last record
// is deleted leaves nothing behind, so that a store of short-lived scopes
// does not grow.
func TestScopeDroppedWithItsLastRecord(t *testing.T) {
	ctx := t.Context()
	s := New(Config{})
	for _, k := range []string{"a", "b"} {
		res, err := s.Reserve(ctx, store.ReserveParams{Scope: "s", Key: k, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Release(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: "s", Key: k, Fence: res.Record.Fence}, Error: "x"})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range []string{"a", "b"} {
		if err := s.Delete(ctx, store.DeleteParams{Scope: "s", Key: k}); err != nil {
			t.Fatal(err)
		}
		if n, want := len(s.scopes), 1-i; n != want {
			t.Fatalf("after deleting %s: %d scopes, want %d", k, n, want)
		}
	}
	if s.last != nil {
		t.Error("the last scope is still remembered")
	}
	if _, err := s.Get(ctx, "s", "a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of a deleted record: %v, want ErrNotFound", err)
	}
}

// TestCodes checks that every state and lease policy has a code that
// names it back, and that the named codes are those of their states.
func TestCodes(t *testing.T) {
	for _, s := range []store.State{store.StateInProgress, store.StateCompleted, store.StateFailedRetryable, store.StateUnknown, store.StateExpired, store.StatePending} {
		if got := states[stateOf(s)]; got != s || !s.Valid() {
			t.Errorf("state %q comes back as %q", s, got)
		}
	}
	named := map[stateCode]store.State{stInProgress: store.StateInProgress, stCompleted: store.StateCompleted,
		stFailedRetryable: store.StateFailedRetryable, stUnknown: store.StateUnknown, stExpired: store.StateExpired, stPending: store.StatePending}
	for c, s := range named {
		if states[c] != s {
			t.Errorf("code %d names %q, want %q", c, states[c], s)
		}
	}
	for _, p := range []store.LeasePolicy{store.LeaseUnknown, store.LeaseRetry, store.LeaseResume} {
		if got := policies[policyOf(p)]; got != p {
			t.Errorf("policy %q comes back as %q", p, got)
		}
	}
	if policies[leaseUnknown] != store.LeaseUnknown {
		t.Errorf("leaseUnknown names %q", policies[leaseUnknown])
	}
}
