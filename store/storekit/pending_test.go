package storekit_test

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// ApplyPending makes a reclaimed or taken-over record a new execution:
// pending with the new request, a fence above the old one, no error,
// response or reconciliation left from the execution before (and, for a
// reclaim, a new ExpiresAt). A recreated record gets a fence above the one
// it replaces even when the clock is behind it, so that no fence is handed
// out twice for one key. A record it returns untouched is not written.
func TestApplyPending(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	past, future := now.Add(-time.Minute), now.Add(time.Hour)
	ahead := now.UnixMicro() + 500 // a fence issued before the clock was set back
	req := store.PendingRequest{Queue: "q", Method: http.MethodPost, Target: "/pay", Body: []byte("new")}
	p := &store.PendingParams{
		ReserveParams: store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute,
			TTL: 24 * time.Hour, LeasePolicy: store.LeaseRetry},
		Request: req,
	}
	old := func(st store.State, lockedUntil, expires time.Time) *store.Record {
		return &store.Record{
			Scope: "s", Key: "k", Fingerprint: "fp", State: st, Fence: ahead, LeasePolicy: store.LeaseRetry,
			LockedUntil: lockedUntil, LastError: "boom", Attempts: 2, ReconcileAttempts: 3,
			Response: &store.Response{Status: http.StatusBadGateway}, CreatedAt: past.Add(-time.Hour),
			UpdatedAt: past, CompletedAt: past, ExpiresAt: expires,
			Request: &store.PendingRequest{Queue: "q", Method: http.MethodPost, Target: "/pay", Body: []byte("old")},
		}
	}
	// again is prev as a new pending execution of p, expiring at expires.
	again := func(prev *store.Record, expires time.Time) store.Record {
		r := *prev
		r.State, r.Fence, r.LockedUntil, r.ExpiresAt = store.StatePending, ahead+1, now.Add(time.Minute), expires
		r.LastError, r.ReconcileAttempts, r.Response, r.CompletedAt = "", 0, nil, time.Time{}
		r.UpdatedAt, r.Request = now, &req
		return r
	}
	failed := old(store.StateFailedRetryable, past, future)
	hung := old(store.StateInProgress, past, future)
	live := old(store.StateInProgress, future, future)
	other := old(store.StateFailedRetryable, past, future)
	other.Fingerprint = "other"
	for name, c := range map[string]struct {
		prev  *store.Record
		out   store.ReserveOutcome
		want  store.Record
		write bool
	}{
		"recreated past expiry": {old(store.StateCompleted, past, past), store.Created, store.Record{
			Scope: "s", Key: "k", Fingerprint: "fp", State: store.StatePending, Fence: ahead + 1,
			LeasePolicy: store.LeaseRetry, LockedUntil: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now,
			ExpiresAt: now.Add(24 * time.Hour), Request: &req,
		}, true},
		"reclaimed":         {failed, store.Reclaimed, again(failed, now.Add(24*time.Hour)), true},
		"taken over":        {hung, store.TakenOver, again(hung, future), true},
		"in flight, as is":  {live, store.Existing, *live, false},
		"another request's": {other, store.Existing, *other, false},
	} {
		out, r, write, err := storekit.ApplyPending(c.prev, p, now, nil)
		if err != nil || out != c.out || write != c.write || !reflect.DeepEqual(r, c.want) {
			t.Errorf("%s: %v, write %v, %v,\n%+v\nwant %v, write %v,\n%+v", name, out, write, err, r, c.out, c.write, c.want)
		}
	}
}
