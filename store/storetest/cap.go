package storetest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idem-go/idem/store"
)

// The tenant cap (ReserveParams.MaxActive): a store-side count of the
// tenant's active records, made atomically with the reserve.

func runCap(t *testing.T, h Harness) {
	if h.NoTenantCap {
		t.Run("TenantCapUnsupported", func(t *testing.T) { testTenantCapUnsupported(t, h) })
		return
	}
	t.Run("TenantCap", func(t *testing.T) { testTenantCap(t, h) })
	t.Run("TenantCapConcurrent", func(t *testing.T) { testTenantCapConcurrent(t, h) })
	if h.Shared {
		t.Run("TenantCapTwoHandles", func(t *testing.T) { testTenantCapTwoHandles(t, h) })
	}
}

// capP is a reservation of key for tenant under a cap of max.
func (e *env) capP(tenant, key, fp string, max int) store.ReserveParams {
	p := e.reserveP("scope-"+tenant, key, fp, store.LeaseUnknown)
	p.Tenant, p.MaxActive = tenant, max
	return p
}

// overCap checks that p is refused with ErrOverCap and left nothing behind
// (or left the record as it was, for before).
func (e *env) overCap(p store.ReserveParams, before *store.Record) {
	e.t.Helper()
	res, err := e.s.Reserve(e.ctx, p)
	if !errors.Is(err, store.ErrOverCap) {
		e.t.Fatalf("Reserve(%s) over the cap: %v %v, want ErrOverCap", p.Key, res.Outcome, err)
	}
	if errors.Is(err, store.ErrInvalidParams) || store.IsRetryable(err) {
		e.t.Fatalf("ErrOverCap must be a definite answer of its own: %v", err)
	}
	if before != nil {
		e.mustUnchanged(*before, "a reserve over the cap")
		return
	}
	if _, err := e.s.Get(e.ctx, p.Scope, p.Key); !errors.Is(err, store.ErrNotFound) {
		e.t.Fatalf("a reserve over the cap left a record: %v", err)
	}
}

func testTenantCap(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const max = 3
	var held []store.Record
	for i := range max {
		res := e.reserve(e.s, e.capP("a", fmt.Sprint("k", i), "fp", max))
		if res.Outcome != store.Created {
			t.Fatalf("reserve %d under the cap: %v", i, res.Outcome)
		}
		held = append(held, res.Record)
	}
	e.overCap(e.capP("a", "k-over", "fp", max), nil)

	// Another tenant has a cap of its own; no cap is no cap.
	if res := e.reserve(e.s, e.capP("b", "k0", "fp", max)); res.Outcome != store.Created {
		t.Fatalf("another tenant: %v", res.Outcome)
	}
	if res := e.reserve(e.s, e.reserveP("scope-a", "uncapped", "fp", store.LeaseUnknown)); res.Outcome != store.Created {
		t.Fatalf("a reserve without a cap: %v", res.Outcome)
	}

	// An in-flight duplicate is answered, not refused, and a reuse of the
	// key with another request too.
	if res := e.reserve(e.s, e.capP("a", "k0", "fp", max)); res.Outcome != store.Existing || res.Record.State != store.StateInProgress {
		t.Fatalf("in-flight duplicate at the cap: %v %s", res.Outcome, res.Record.State)
	}
	if res := e.reserve(e.s, e.capP("a", "k0", "other", max)); res.Outcome != store.Existing {
		t.Fatalf("key reuse at the cap: %v", res.Outcome)
	}

	// A completed record leaves the count: its replay is answered, and a
	// new key fits again.
	e.complete(held[0], sampleResponse())
	if res := e.reserve(e.s, e.capP("a", "k0", "fp", max)); res.Outcome != store.Existing || res.Record.State != store.StateCompleted {
		t.Fatalf("replay: %v %s", res.Outcome, res.Record.State)
	}
	if res := e.reserve(e.s, e.capP("a", "k3", "fp", max)); res.Outcome != store.Created {
		t.Fatalf("a new key after a completion freed a place: %v", res.Outcome)
	}
	e.overCap(e.capP("a", "k4", "fp", max), nil)

	// An unknown record still counts; a released one does not, and taking
	// it back is refused while the tenant is at its cap.
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(held[1]), Error: "test"}); err != nil {
		t.Fatal(err)
	}
	e.overCap(e.capP("a", "k4", "fp", max), nil)
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(held[2]), Error: "test"}); err != nil {
		t.Fatal(err)
	}
	r3 := e.reserve(e.s, e.capP("a", "k4", "fp", max))
	if r3.Outcome != store.Created {
		t.Fatalf("a new key after a release freed a place: %v", r3.Outcome)
	}
	released := e.get("scope-a", "k2")
	e.overCap(e.capP("a", "k2", "fp", max), &released)

	// An expired lease is still answered at the cap (moved to unknown).
	e.clock.Advance(lease)
	if res := e.reserve(e.s, e.capP("a", "k4", "fp", max)); res.Outcome != store.Existing || res.Record.State != store.StateUnknown {
		t.Fatalf("an expired lease at the cap: %v %s", res.Outcome, res.Record.State)
	}

	// Settling the unknown record frees its place: the released key can
	// be taken back.
	if err := e.s.Resolve(e.ctx, store.ResolveParams{Scope: "scope-a", Key: "k1", To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	if res := e.reserve(e.s, e.capP("a", "k2", "fp", max)); res.Outcome != store.Reclaimed {
		t.Fatalf("reclaim after a place was freed: %v", res.Outcome)
	}

	// A negative cap is a bad parameter.
	p := e.capP("a", "k9", "fp", -1)
	if _, err := e.s.Reserve(e.ctx, p); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("negative MaxActive: %v", err)
	}
}

// testTenantCapConcurrent: n racers reserving distinct keys of one tenant
// under a cap of max: exactly max get the key, the others ErrOverCap.
func testTenantCapConcurrent(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const n, max = 32, 5
	for round := range 3 {
		tenant := fmt.Sprint("t", round)
		errs := make([]error, n)
		res := race(t, n, func(i int) (store.ReserveResult, error) {
			r, err := e.s.Reserve(e.ctx, e.capP(tenant, fmt.Sprint("k", i), "fp", max))
			errs[i] = err
			if errors.Is(err, store.ErrOverCap) {
				err = nil
			}
			return r, err
		})
		over := 0
		for _, err := range errs {
			if errors.Is(err, store.ErrOverCap) {
				over++
			}
		}
		if c := countOutcomes(res, store.Created); c != max || over != n-max {
			t.Fatalf("round %d: %d created and %d over the cap of %d racers, want %d and %d", round, c, over, n, max, n-max)
		}
	}
}

// testTenantCapTwoHandles: the cap holds across processes sharing a
// database.
func testTenantCapTwoHandles(t *testing.T, h Harness) {
	e := newEnv(t, h)
	other := e.open(t, e.clock.Now)
	const n, max = 16, 4
	errs := make([]error, n)
	res := race(t, n, func(i int) (store.ReserveResult, error) {
		s := e.s
		if i%2 == 1 {
			s = other
		}
		r, err := s.Reserve(e.ctx, e.capP("t", fmt.Sprint("k", i), "fp", max))
		errs[i] = err
		if errors.Is(err, store.ErrOverCap) {
			err = nil
		}
		return r, err
	})
	if c := countOutcomes(res, store.Created); c != max {
		t.Fatalf("%d created across two handles, want %d", c, max)
	}
}

// testTenantCapUnsupported: a store that cannot count says so at once and
// reserves nothing.
func testTenantCapUnsupported(t *testing.T, h Harness) {
	e := newEnv(t, h)
	if _, ok := e.s.(store.CapRefuser); !ok {
		t.Fatalf("%T refuses the cap but does not implement store.CapRefuser", e.s)
	}
	_, err := e.s.Reserve(e.ctx, e.capP("a", "k", "fp", 1))
	if !errors.Is(err, store.ErrCapUnsupported) {
		t.Fatalf("capped Reserve: %v, want ErrCapUnsupported", err)
	}
	if _, err := e.s.Get(e.ctx, "scope-a", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused capped Reserve left a record: %v", err)
	}
	if res := e.reserve(e.s, e.capP("a", "k", "fp", 0)); res.Outcome != store.Created {
		t.Fatalf("uncapped Reserve: %v", res.Outcome)
	}
}
