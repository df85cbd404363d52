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
	t.Run("TenantCapCountsUncapped", func(t *testing.T) { testTenantCapCountsUncapped(t, h) })
	t.Run("TenantCapPending", func(t *testing.T) { testTenantCapPending(t, h) })
	t.Run("TenantCapPendingConcurrent", func(t *testing.T) { testTenantCapPendingConcurrent(t, h, false) })
	if h.Shared {
		t.Run("TenantCapTwoHandles", func(t *testing.T) { testTenantCapTwoHandles(t, h) })
		t.Run("TenantCapPendingTwoHandles", func(t *testing.T) { testTenantCapPendingConcurrent(t, h, true) })
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
	e.refusedAtCap("Reserve", p, res, err, before)
}

// overCapPending is overCap for ReservePending.
func (e *env) overCapPending(p store.PendingParams, before *store.Record) {
	e.t.Helper()
	res, err := e.queue().ReservePending(e.ctx, p)
	e.refusedAtCap("ReservePending", p.ReserveParams, res, err, before)
}

// refusedAtCap checks what a reserve of p over the cap answered.
func (e *env) refusedAtCap(op string, p store.ReserveParams, res store.ReserveResult, err error, before *store.Record) {
	e.t.Helper()
	if !errors.Is(err, store.ErrOverCap) {
		e.t.Fatalf("%s(%s) over the cap: %v %v, want ErrOverCap", op, p.Key, res.Outcome, err)
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
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: e.fenceNow("scope-a", "k1"), To: store.StateFailedRetryable}); err != nil {
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
		raceAtCap(t, fmt.Sprint("round ", round), n, max, func(i int) (store.ReserveResult, error) {
			return e.s.Reserve(e.ctx, e.capP(tenant, fmt.Sprint("k", i), "fp", max))
		})
	}
}

// raceAtCap runs n racers through reserve, all under a cap of max, and
// checks that exactly max of them created a record and the others were
// refused with ErrOverCap.
func raceAtCap(t *testing.T, what string, n, max int, reserve func(i int) (store.ReserveResult, error)) {
	t.Helper()
	errs := make([]error, n)
	res := race(t, n, func(i int) (store.ReserveResult, error) {
		r, err := reserve(i)
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
		t.Fatalf("%s: %d created and %d over the cap of %d racers, want %d and %d", what, c, over, n, max, n-max)
	}
}

// testTenantCapCountsUncapped: records reserved without a cap, by racers
// (so a store that gathers concurrent calls into batches batches them),
// still belong to their tenant: a later capped reserve counts them.
func testTenantCapCountsUncapped(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const n = 24
	res := race(t, n, func(i int) (store.ReserveResult, error) {
		p := e.capP("u", fmt.Sprint("k", i), "fp", 0)
		return e.s.Reserve(e.ctx, p)
	})
	if c := countOutcomes(res, store.Created); c != n {
		t.Fatalf("%d of %d uncapped racers created their key", c, n)
	}
	e.overCap(e.capP("u", "one-more", "fp", n), nil)
	if _, err := e.s.Reserve(e.ctx, e.capP("other", "one-more", "fp", 1)); err != nil {
		t.Fatalf("another tenant under its own cap: %v", err)
	}
	if r, err := e.s.Reserve(e.ctx, e.capP("u", "one-more", "fp", n+1)); err != nil || r.Outcome != store.Created {
		t.Fatalf("under a cap one above the %d uncapped records: %v %v", n, r.Outcome, err)
	}
}

// testTenantCapTwoHandles: the cap holds across processes sharing a
// database.
func testTenantCapTwoHandles(t *testing.T, h Harness) {
	e := newEnv(t, h)
	other := e.open(t, e.clock.Now)
	const n, max = 16, 4
	raceAtCap(t, "two handles", n, max, func(i int) (store.ReserveResult, error) {
		s := e.s
		if i%2 == 1 {
			s = other
		}
		return s.Reserve(e.ctx, e.capP("t", fmt.Sprint("k", i), "fp", max))
	})
}

// capPending is a pending reservation of key for tenant under a cap of max.
func (e *env) capPending(tenant, key, fp string, max int) store.PendingParams {
	p := e.pendingP("scope-"+tenant, key, fp, "capped", store.LeaseUnknown)
	p.Tenant, p.MaxActive = tenant, max
	return p
}

// testTenantCapPending: pending records count against the cap like
// in_progress ones, through either reserve, and ReservePending is refused
// by the cap exactly where Reserve is.
func testTenantCapPending(t *testing.T, h Harness) {
	e := newEnv(t, h)
	q := e.queue()
	const max = 3
	// One synchronous and two pending reservations fill one count.
	sync := e.reserve(e.s, e.capP("a", "sync", "fp", max))
	p0 := e.reservePending(e.capPending("a", "p0", "fp", max))
	p1 := e.reservePending(e.capPending("a", "p1", "fp", max))
	for _, r := range []store.ReserveResult{sync, p0, p1} {
		if r.Outcome != store.Created {
			t.Fatalf("%s under the cap: %v", r.Record.Key, r.Outcome)
		}
	}
	e.overCapPending(e.capPending("a", "p-over", "fp", max), nil)
	e.overCap(e.capP("a", "s-over", "fp", max), nil)
	// Another tenant, and no cap, are not refused.
	if r := e.reservePending(e.capPending("b", "p0", "fp", max)); r.Outcome != store.Created {
		t.Fatalf("another tenant: %v", r.Outcome)
	}
	if r := e.reservePending(e.pendingP("scope-a", "uncapped", "fp", "capped", store.LeaseUnknown)); r.Outcome != store.Created {
		t.Fatalf("a pending reserve without a cap: %v", r.Outcome)
	}

	// Duplicates of a pending key at the cap are answered, not refused,
	// through either reserve, and a reuse of the key with another request.
	before := e.get("scope-a", "p0")
	if r := e.reservePending(e.capPending("a", "p0", "fp", max)); r.Outcome != store.Existing || r.Record.State != store.StatePending {
		t.Fatalf("pending duplicate at the cap: %v %s", r.Outcome, r.Record.State)
	}
	if r := e.reservePending(e.capPending("a", "p0", "other", max)); r.Outcome != store.Existing {
		t.Fatalf("pending key reuse at the cap: %v", r.Outcome)
	}
	if r := e.reserve(e.s, e.capP("a", "p0", "fp", max)); r.Outcome != store.Existing || r.Record.State != store.StatePending {
		t.Fatalf("Reserve of a pending key at the cap: %v %s", r.Outcome, r.Record.State)
	}
	if r := e.reservePending(e.capPending("a", "sync", "fp", max)); r.Outcome != store.Existing || r.Record.State != store.StateInProgress {
		t.Fatalf("ReservePending of an in-flight key at the cap: %v %s", r.Outcome, r.Record.State)
	}
	e.mustUnchanged(before, "duplicates at the cap")

	// A claimed record still counts; completing it frees a place, and its
	// replay is answered.
	claimed := e.claim(q, "capped", 10)
	var c0, c1 store.Record
	for _, r := range claimed {
		switch {
		case r.Scope == "scope-a" && r.Key == "p0":
			c0 = r
		case r.Scope == "scope-a" && r.Key == "p1":
			c1 = r
		}
	}
	if len(claimed) != 4 || c0.Fence == 0 || c1.Fence == 0 {
		t.Fatalf("claimed %v, want a's p0, p1 and uncapped, and b's p0", keys(claimed))
	}
	e.overCapPending(e.capPending("a", "p-over", "fp", max), nil)
	e.complete(c0, sampleResponse())
	if r := e.reservePending(e.capPending("a", "p0", "fp", max)); r.Outcome != store.Existing || r.Record.State != store.StateCompleted {
		t.Fatalf("pending replay: %v %s", r.Outcome, r.Record.State)
	}
	if r := e.reservePending(e.capPending("a", "p2", "fp", max)); r.Outcome != store.Created {
		t.Fatalf("a new pending key after a completion freed a place: %v", r.Outcome)
	}
	e.overCapPending(e.capPending("a", "p-over", "fp", max), nil)

	// A released record does not count, and taking it back is refused at
	// the cap, leaving it as it was.
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(c1), Error: "test"}); err != nil {
		t.Fatal(err)
	}
	if r := e.reservePending(e.capPending("a", "p3", "fp", max)); r.Outcome != store.Created {
		t.Fatalf("a new pending key after a release freed a place: %v", r.Outcome)
	}
	released := e.get("scope-a", "p1")
	e.overCapPending(e.capPending("a", "p1", "fp", max), &released)

	// Past the TTL, the completed p0 may be recreated, but not at the cap
	// (sync, p2 and p3 are still active: a lease or a claim deadline that
	// passed does not end a record).
	e.clock.Advance(ttl)
	expired := e.get("scope-a", "p0")
	e.overCapPending(e.capPending("a", "p0", "fp", max), &expired)
	// Ending the pending records frees two places: p0 is recreated, and a
	// released key past its TTL is recreated for the tenant that sends it
	// (a record belongs to the tenant that created it).
	if ended, err := q.ExpirePending(e.ctx, store.ExpirePendingParams{Limit: 100, Response: sampleResponse()}); err != nil || len(ended) != 2 {
		t.Fatalf("expiring p2 and p3: %d ended, %v", len(ended), err)
	}
	if r := e.reservePending(e.capPending("a", "p0", "fp", max)); r.Outcome != store.Created || r.Record.State != store.StatePending {
		t.Fatalf("recreating an expired key under the cap: %v %s", r.Outcome, r.Record.State)
	}
	p1c := e.capPending("c", "p1", "fp", 1)
	p1c.Scope = "scope-a"
	if r := e.reservePending(p1c); r.Outcome != store.Created {
		t.Fatalf("recreating a released key past its TTL for another tenant: %v", r.Outcome)
	}
	e.overCapPending(e.capPending("c", "c-over", "fp", 1), nil)
	// a holds sync and p0: one more place, then the cap.
	if r := e.reservePending(e.capPending("a", "p4", "fp", max)); r.Outcome != store.Created {
		t.Fatalf("the last place: %v", r.Outcome)
	}
	e.overCap(e.capP("a", "s-over", "fp", max), nil)
}

// testTenantCapPendingConcurrent: racers reserving distinct keys of one
// tenant, half through Reserve and half through ReservePending (on two
// handles when shared): exactly max get a record, the others ErrOverCap.
func testTenantCapPendingConcurrent(t *testing.T, h Harness, shared bool) {
	e := newEnv(t, h)
	var other store.Store = e.s
	if shared {
		other = e.open(t, e.clock.Now)
	}
	const n, max = 32, 5
	for round := range 3 {
		tenant := fmt.Sprint("t", round)
		mixed := round > 0 // the first round is pending only
		raceAtCap(t, fmt.Sprint("round ", round), n, max, func(i int) (store.ReserveResult, error) {
			s := e.s
			if i%2 == 1 {
				s = other
			}
			if mixed && i%4 >= 2 {
				return s.Reserve(e.ctx, e.capP(tenant, fmt.Sprint("k", i), "fp", max))
			}
			return s.(store.Queue).ReservePending(e.ctx, e.capPending(tenant, fmt.Sprint("k", i), "fp", max))
		})
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
	_, err = e.queue().ReservePending(e.ctx, e.capPending("a", "kp", "fp", 1))
	if !errors.Is(err, store.ErrCapUnsupported) {
		t.Fatalf("capped ReservePending: %v, want ErrCapUnsupported", err)
	}
	if _, err := e.s.Get(e.ctx, "scope-a", "kp"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused capped ReservePending left a record: %v", err)
	}
}

// testCountActive: the count behind the engine's bound across the store
// (store.ActiveCounter) sees every tenant's pending, in_progress and
// unknown records, never a terminal one, and stops at its limit.
func testCountActive(t *testing.T, h Harness) {
	e := newEnv(t, h)
	c, ok := e.s.(store.ActiveCounter)
	if h.NoActiveCount {
		r, refuses := e.s.(store.ActiveCountRefuser)
		switch {
		case ok && (!refuses || r.ActiveCountUnsupported() == ""):
			t.Fatalf("%T implements store.ActiveCounter but the harness says it does not count", e.s)
		case ok:
			if _, err := c.CountActive(e.ctx, 1); !errors.Is(err, store.ErrCapUnsupported) {
				t.Fatalf("CountActive on a store that refuses to count: %v, want ErrCapUnsupported", err)
			}
		}
		return
	}
	if h.NoTenantCap {
		// Counting needs what the tenant cap needs: refused without it.
		if ok {
			if _, err := c.CountActive(e.ctx, 1); !errors.Is(err, store.ErrCapUnsupported) {
				t.Fatalf("CountActive on a store without the tenant cap: %v, want ErrCapUnsupported", err)
			}
		}
		return
	}
	if !ok {
		t.Fatalf("%T does not implement store.ActiveCounter", e.s)
	}
	count := func(limit, want int) {
		t.Helper()
		if n, err := c.CountActive(e.ctx, limit); err != nil || n != want {
			t.Fatalf("CountActive(%d) = %d, %v, want %d", limit, n, err, want)
		}
	}
	count(10, 0)
	e.complete(e.create("t1", "done", "fp", store.LeaseUnknown), sampleResponse())
	released := e.create("t2", "released", "fp", store.LeaseUnknown)
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(released), Error: "refused"}); err != nil {
		t.Fatal(err)
	}
	count(10, 0)
	e.create("t1", "running", "fp", store.LeaseUnknown)
	gone := e.create("t3", "gone", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(gone), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	e.reservePending(e.pendingP("t4", "queued", "fp", "q", store.LeaseUnknown))
	count(10, 3)
	count(3, 3)
	count(2, 2)
	if _, err := c.CountActive(e.ctx, 0); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("CountActive(0): %v, want ErrInvalidParams", err)
	}
}
