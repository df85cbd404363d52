package storetest

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// wait is how long a pending request may wait for a worker in these tests.
const wait = time.Minute

// runPending runs the asynchronous acceptance tests (store.Queue).
func runPending(t *testing.T, h Harness) {
	t.Run("PendingReserve", func(t *testing.T) { testPendingReserve(t, h) })
	t.Run("PendingClaimOnce", func(t *testing.T) { testPendingClaimOnce(t, h) })
	t.Run("PendingClaimCompleteReplay", func(t *testing.T) { testPendingComplete(t, h) })
	t.Run("PendingExpire", func(t *testing.T) { testPendingExpire(t, h) })
	t.Run("PendingRequeue", func(t *testing.T) { testPendingRequeue(t, h) })
	t.Run("PendingInvalid", func(t *testing.T) { testPendingInvalid(t, h) })
	t.Run("PendingUnknownKeepsRequest", func(t *testing.T) { testPendingUnknown(t, h) })
	t.Run("PendingRequestClearedWhenSettled", func(t *testing.T) { testPendingCleared(t, h) })
	t.Run("PendingHasNoOwner", func(t *testing.T) { testPendingOwner(t, h) })
}

func (e *env) queue() store.Queue {
	e.t.Helper()
	q, why := store.AsQueue(e.s)
	if q == nil {
		e.t.Fatalf("%T keeps no pending requests: %s", e.s, why)
	}
	return q
}

func sampleRequest(queue string) store.PendingRequest {
	h := http.Header{}
	h.Add("Content-Type", "application/json")
	h.Add("X-Multi", "one")
	h.Add("X-Multi", "two")
	return store.PendingRequest{Queue: queue, Method: "POST", Target: "/v1/reports?x=1&y=%20", Header: h,
		Body: []byte("{\"from\":\"2030-01-01\",\"bin\":\"\x00\xff\"}")}
}

func (e *env) pendingP(scope, key, fp, queue string, policy store.LeasePolicy) store.PendingParams {
	return store.PendingParams{
		ReserveParams: store.ReserveParams{Scope: scope, Key: key, Fingerprint: fp, Lease: wait, TTL: ttl, LeasePolicy: policy},
		Request:       sampleRequest(queue),
	}
}

func (e *env) reservePending(p store.PendingParams) store.ReserveResult {
	e.t.Helper()
	res, err := e.queue().ReservePending(e.ctx, p)
	if err != nil {
		e.t.Fatalf("ReservePending(%s/%s): %v", p.Scope, p.Key, err)
	}
	return res
}

func (e *env) claim(q store.Queue, queue string, limit int) []store.Record {
	e.t.Helper()
	rs, err := q.Claim(e.ctx, store.ClaimParams{Queue: queue, Limit: limit, Lease: lease})
	if err != nil {
		e.t.Fatalf("Claim(%s): %v", queue, err)
	}
	return rs
}

func samePending(a, b *store.PendingRequest) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Queue == b.Queue && a.Method == b.Method && a.Target == b.Target &&
		string(a.Body) == string(b.Body) && sameHeader(a.Header, b.Header)
}

func testPendingReserve(t *testing.T, h Harness) {
	e := newEnv(t, h)
	now := e.clock.Now()
	p := e.pendingP("t:POST /v1/reports", "k1", "fp", "reports", store.LeaseUnknown)
	res := e.reservePending(p)
	r := res.Record
	if res.Outcome != store.Created || r.State != store.StatePending || r.Fence != now.UnixMicro() || r.Attempts != 0 {
		t.Fatalf("pending reserve: %v %s fence %d attempts %d, want created pending %d 0", res.Outcome, r.State, r.Fence, now.UnixMicro(), r.Attempts)
	}
	wantTime(t, "LockedUntil (claim deadline)", r.LockedUntil, now.Add(wait))
	wantTime(t, "ExpiresAt", r.ExpiresAt, now.Add(ttl))
	if !samePending(r.Request, &p.Request) {
		t.Fatalf("pending record request %+v, want %+v", r.Request, p.Request)
	}
	got := e.get(r.Scope, r.Key)
	if d := diffRecords(r, got); len(d) > 0 {
		t.Fatalf("Get differs from the pending record in %v", d)
	}
	// Duplicates see the pending record, through either reserve, untouched.
	e.clock.Advance(time.Second)
	dup := e.reservePending(p)
	if dup.Outcome != store.Existing || dup.Record.State != store.StatePending || dup.Record.Fence != r.Fence {
		t.Fatalf("pending duplicate: %v %s fence %d", dup.Outcome, dup.Record.State, dup.Record.Fence)
	}
	sync := e.reserve(e.s, e.reserveP(r.Scope, r.Key, "fp", store.LeaseUnknown))
	if sync.Outcome != store.Existing || sync.Record.State != store.StatePending {
		t.Fatalf("Reserve of a pending key: %v %s, want existing pending", sync.Outcome, sync.Record.State)
	}
	other := e.pendingP(r.Scope, r.Key, "fp-other", "reports", store.LeaseUnknown)
	if mis := e.reservePending(other); mis.Outcome != store.Existing || mis.Record.Fingerprint != "fp" {
		t.Fatalf("pending reserve with another fingerprint: %v %s", mis.Outcome, mis.Record.Fingerprint)
	}
	e.mustUnchanged(got, "duplicates of a pending request")
	// A pending record is not a lease: the sweeper leaves it alone, even
	// past its deadline.
	e.clock.Advance(wait)
	if swept, err := e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 10}); err != nil || len(swept) != 0 {
		t.Fatalf("sweep over a pending record: %d swept, %v", len(swept), err)
	}
	e.mustUnchanged(got, "a sweep")
}

// testPendingOwner: a pending record that takes over, reclaims or
// replaces a record a Reserve started is a new execution no Reserve
// started: Owner 0, and so is the worker's claim of it.
func testPendingOwner(t *testing.T, h Harness) {
	e := newEnv(t, h)
	owned := func(key string) store.Record {
		p := e.reserveP("s", key, "fp", store.LeaseRetry)
		p.Owner = 5
		return e.reserve(e.s, p).Record
	}
	owned("held")
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(owned("released")), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	e.complete(owned("done"), sampleResponse())
	pending := func(key string, want store.ReserveOutcome) {
		t.Helper()
		res := e.reservePending(e.pendingP("s", key, "fp", "q-"+key, store.LeaseRetry))
		if res.Outcome != want || res.Record.Owner != 0 {
			t.Fatalf("%s: pending over a Reserve's record: %v, Owner %d; want %v, 0", key, res.Outcome, res.Record.Owner, want)
		}
		claimed := e.claim(e.queue(), "q-"+key, 1)
		if len(claimed) != 1 || claimed[0].Owner != 0 || e.get("s", key).Owner != 0 {
			t.Fatalf("%s: claimed %d records, Owner of the claim %v", key, len(claimed), claimed)
		}
	}
	e.clock.Advance(lease)
	pending("held", store.TakenOver)
	pending("released", store.Reclaimed)
	e.clock.Advance(ttl)
	pending("done", store.Created)
}

func testPendingClaimOnce(t *testing.T, h Harness) {
	e := newEnv(t, h)
	handles := []store.Queue{e.queue()}
	if h.Shared {
		other, why := store.AsQueue(e.open(t, e.clock.Now))
		if other == nil {
			t.Fatalf("second handle keeps no pending requests: %s", why)
		}
		handles = append(handles, other)
	}
	const n = 40
	for i := range n {
		e.reservePending(e.pendingP(fmt.Sprint("t", i%3, ":POST /r"), fmt.Sprint("k", i), "fp", "work", store.LeaseUnknown))
		e.clock.Advance(time.Microsecond)
	}
	e.reservePending(e.pendingP("t:POST /r", "elsewhere", "fp", "other", store.LeaseUnknown))
	claimedAt := e.clock.Now()
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		wg   sync.WaitGroup
		errs = make(chan error, 16)
	)
	for w := range 16 {
		wg.Go(func() {
			for {
				rs, err := handles[w%len(handles)].Claim(e.ctx, store.ClaimParams{Queue: "work", Limit: 3, Lease: lease})
				if err != nil {
					errs <- err
					return
				}
				if len(rs) == 0 {
					return
				}
				mu.Lock()
				for _, r := range rs {
					seen[r.Scope+"/"+r.Key]++
					if r.State != store.StateInProgress || r.Attempts != 1 || r.Fence <= claimedAt.UnixMicro()-n ||
						!r.LockedUntil.Equal(claimedAt.Add(lease)) || r.Request == nil || r.Request.Queue != "work" {
						errs <- fmt.Errorf("claimed record %s/%s: %s attempts %d fence %d locked %v request %+v",
							r.Scope, r.Key, r.State, r.Attempts, r.Fence, r.LockedUntil, r.Request)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("%d records claimed, want %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("%s claimed %d times", k, c)
		}
	}
	if got := e.get("t:POST /r", "elsewhere"); got.State != store.StatePending {
		t.Fatalf("a record of another queue was claimed: %s", got.State)
	}
	// Oldest first.
	for i := range 3 {
		e.reservePending(e.pendingP("s", fmt.Sprint("order", 2-i), "fp", "order", store.LeaseUnknown))
		e.clock.Advance(time.Millisecond)
	}
	first := e.claim(e.queue(), "order", 2)
	if len(first) != 2 || first[0].Key != "order2" || first[1].Key != "order1" {
		t.Fatalf("claim order: %v", keys(first))
	}
}

func testPendingComplete(t *testing.T, h Harness) {
	e := newEnv(t, h)
	p := e.pendingP("s", "k", "fp", "q", store.LeaseUnknown)
	pending := e.reservePending(p).Record
	e.clock.Advance(time.Second)
	rs := e.claim(e.queue(), "q", 10)
	if len(rs) != 1 {
		t.Fatalf("claimed %d, want 1", len(rs))
	}
	c := rs[0]
	if c.Fence <= pending.Fence || !samePending(c.Request, &p.Request) {
		t.Fatalf("claimed record fence %d (pending %d), request %+v", c.Fence, pending.Fence, c.Request)
	}
	if again := e.claim(e.queue(), "q", 10); len(again) != 0 {
		t.Fatalf("an in-progress record was claimed again: %v", keys(again))
	}
	// While in progress, duplicates see it; the pending fence is stale.
	if dup := e.reservePending(p); dup.Outcome != store.Existing || dup.Record.State != store.StateInProgress {
		t.Fatalf("duplicate while claimed: %v %s", dup.Outcome, dup.Record.State)
	}
	resp := sampleResponse()
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(pending), Response: resp}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete with the pending fence: %v, want ErrLeaseLost", err)
	}
	if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(c), Lease: lease}); err != nil {
		t.Fatalf("worker's Extend: %v", err)
	}
	e.complete(c, resp)
	for _, res := range []store.ReserveResult{e.reservePending(p), e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown))} {
		if res.Outcome != store.Existing || res.Record.State != store.StateCompleted || !sameResponse(res.Record.Response, &resp) {
			t.Fatalf("replay after the worker completed: %v %s %+v", res.Outcome, res.Record.State, res.Record.Response)
		}
	}
	if got := e.get("s", "k"); got.Attempts != 1 || got.Fence != c.Fence {
		t.Fatalf("completed record attempts %d fence %d, want 1 %d", got.Attempts, got.Fence, c.Fence)
	}
}

func testPendingExpire(t *testing.T, h Harness) {
	e := newEnv(t, h)
	q := e.queue()
	e.reservePending(e.pendingP("s", "late", "fp", "q", store.LeaseUnknown))
	e.clock.Advance(time.Second)
	e.reservePending(e.pendingP("s", "fresh", "fp", "q", store.LeaseUnknown))
	timeout := store.Response{Status: http.StatusRequestTimeout, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"not run in time"}`)}
	exp := store.ExpirePendingParams{Limit: 10, Response: timeout, TTL: time.Hour}
	if rs, err := q.ExpirePending(e.ctx, exp); err != nil || len(rs) != 0 {
		t.Fatalf("ExpirePending before any deadline: %d, %v", len(rs), err)
	}
	e.clock.Advance(wait - time.Second) // "late" is at its deadline, "fresh" a second before
	if rs := e.claim(q, "q", 10); len(rs) != 1 || rs[0].Key != "fresh" {
		t.Fatalf("claim at the deadline of one: %v, want [fresh]", keys(rs))
	}
	rs, err := q.ExpirePending(e.ctx, exp)
	if err != nil || len(rs) != 1 || rs[0].Key != "late" {
		t.Fatalf("ExpirePending: %v, %v, want [late]", keys(rs), err)
	}
	got := e.get("s", "late")
	if got.State != store.StateCompleted || got.LastError != store.ExpiredPendingError || !sameResponse(got.Response, &timeout) || got.Attempts != 0 {
		t.Fatalf("expired pending record: %s %q %+v attempts %d", got.State, got.LastError, got.Response, got.Attempts)
	}
	wantTime(t, "ExpiresAt of the expired request", got.ExpiresAt, e.clock.Now().Add(time.Hour))
	if rs, err := q.ExpirePending(e.ctx, exp); err != nil || len(rs) != 0 {
		t.Fatalf("second ExpirePending: %v, %v", keys(rs), err)
	}
	// Bounded, and never an in-progress record.
	for i := range 3 {
		e.reservePending(e.pendingP("s", fmt.Sprint("b", i), "fp", "q", store.LeaseUnknown))
	}
	e.clock.Advance(wait)
	if rs, err := q.ExpirePending(e.ctx, store.ExpirePendingParams{Limit: 2, Response: timeout}); err != nil || len(rs) != 2 {
		t.Fatalf("bounded ExpirePending: %d, %v", len(rs), err)
	}
	if got := e.get("s", "fresh"); got.State != store.StateInProgress {
		t.Fatalf("the claimed record became %s", got.State)
	}
	// Past its expiry too, a pending record is left to ExpirePending:
	// the reaper neither deletes nor abandons it.
	e.reservePending(e.pendingP("s", "old", "fp", "q", store.LeaseUnknown))
	e.clock.Advance(ttl)
	before := e.get("s", "old")
	if _, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 100, Abandoned: timeout}); err != nil {
		t.Fatal(err)
	}
	e.mustUnchanged(before, "a reap")
}

func testPendingRequeue(t *testing.T, h Harness) {
	e := newEnv(t, h)
	q := e.queue()
	// A worker that died under policy retry: the client's retry puts the
	// request back in the queue with a new fence.
	p := e.pendingP("s", "retry", "fp", "q", store.LeaseRetry)
	e.reservePending(p)
	c := e.claim(q, "q", 1)[0]
	e.clock.Advance(lease)
	res := e.reservePending(p)
	if res.Outcome != store.TakenOver || res.Record.State != store.StatePending || res.Record.Fence <= c.Fence {
		t.Fatalf("retry after a dead worker (retry): %v %s fence %d", res.Outcome, res.Record.State, res.Record.Fence)
	}
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(c), Response: sampleResponse()}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("the dead worker's Complete: %v, want ErrLeaseLost", err)
	}
	if again := e.claim(q, "q", 1); len(again) != 1 || again[0].Attempts != 2 {
		t.Fatalf("claim of the requeued request: %v", again)
	}
	// Under policy unknown the record goes to reconciliation instead.
	pu := e.pendingP("s", "unknown", "fp", "q", store.LeaseUnknown)
	e.reservePending(pu)
	e.claim(q, "q", 1)
	e.clock.Advance(lease)
	if res := e.reservePending(pu); res.Outcome != store.Existing || res.Record.State != store.StateUnknown || res.Record.LastError != "lease_expired" {
		t.Fatalf("retry after a dead worker (unknown): %v %s %q", res.Outcome, res.Record.State, res.Record.LastError)
	}
	// A released request is queued again by the client's retry.
	pr := e.pendingP("s", "released", "fp", "q", store.LeaseUnknown)
	e.reservePending(pr)
	c = e.claim(q, "q", 1)[0]
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(c), Error: "status 503"}); err != nil {
		t.Fatal(err)
	}
	if res := e.reservePending(pr); res.Outcome != store.Reclaimed || res.Record.State != store.StatePending || res.Record.LastError != "" {
		t.Fatalf("retry of a released request: %v %s %q", res.Outcome, res.Record.State, res.Record.LastError)
	}
	// A terminal record past its expiry is replaced by a new pending one.
	pc := e.pendingP("s", "old", "fp", "q-old", store.LeaseUnknown)
	e.reservePending(pc)
	c = e.claim(q, "q-old", 1)[0]
	e.complete(c, sampleResponse())
	e.clock.Advance(ttl)
	if res := e.reservePending(pc); res.Outcome != store.Created || res.Record.Fence <= c.Fence {
		t.Fatalf("pending reserve over an expired record: %v fence %d", res.Outcome, res.Record.Fence)
	}
	// Delete of a pending record is allowed (nothing is running it).
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: "s", Key: "old"}); err != nil {
		t.Fatalf("Delete of a pending record: %v", err)
	}
	if rs := e.claim(q, "q-old", 10); len(rs) != 0 {
		t.Fatalf("a deleted pending record was claimed: %v", keys(rs))
	}
}

func testPendingInvalid(t *testing.T, h Harness) {
	e := newEnv(t, h)
	q := e.queue()
	good := e.pendingP("s", "k", "fp", "q", store.LeaseUnknown)
	bad := map[string]func(p *store.PendingParams){
		"no queue":         func(p *store.PendingParams) { p.Request.Queue = "" },
		"long queue":       func(p *store.PendingParams) { p.Request.Queue = string(make([]byte, store.MaxQueueBytes+1)) },
		"no method":        func(p *store.PendingParams) { p.Request.Method = "" },
		"bad method":       func(p *store.PendingParams) { p.Request.Method = "PO ST" },
		"no target":        func(p *store.PendingParams) { p.Request.Target = "" },
		"target with LF":   func(p *store.PendingParams) { p.Request.Target = "/a\nb" },
		"bad header name":  func(p *store.PendingParams) { p.Request.Header = http.Header{"Bad Name": {"v"}} },
		"bad header value": func(p *store.PendingParams) { p.Request.Header = http.Header{"X": {"a\rb"}} },
		"huge body":        func(p *store.PendingParams) { p.Request.Body = make([]byte, store.MaxPendingRequestBytes+1) },
		"no wait":          func(p *store.PendingParams) { p.Lease = 0 },
		"no key":           func(p *store.PendingParams) { p.Key = "" },
	}
	for name, mod := range bad {
		p := good
		mod(&p)
		if _, err := q.ReservePending(e.ctx, p); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("ReservePending with %s: %v, want ErrInvalidParams", name, err)
		}
	}
	for name, p := range map[string]store.ClaimParams{
		"no queue": {Limit: 1, Lease: lease}, "no limit": {Queue: "q", Lease: lease}, "no lease": {Queue: "q", Limit: 1},
	} {
		if _, err := q.Claim(e.ctx, p); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("Claim with %s: %v, want ErrInvalidParams", name, err)
		}
	}
	for name, p := range map[string]store.ExpirePendingParams{
		"no limit":     {Response: store.Response{Status: 408}},
		"no response":  {Limit: 1},
		"negative ttl": {Limit: 1, Response: store.Response{Status: 408}, TTL: -time.Second},
	} {
		if _, err := q.ExpirePending(e.ctx, p); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("ExpirePending with %s: %v, want ErrInvalidParams", name, err)
		}
	}
	if _, err := e.s.Get(e.ctx, "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an invalid request left a record: %v", err)
	}
}

// A worker's request whose outcome is unknown keeps the request it was
// accepted with: MarkUnknown without a summary leaves it, and Get returns
// it for the operator.
func testPendingUnknown(t *testing.T, h Harness) {
	e := newEnv(t, h)
	p := e.pendingP("s", "k", "fp", "q", store.LeaseUnknown)
	e.reservePending(p)
	rs := e.claim(e.queue(), "q", 10)
	if len(rs) != 1 {
		t.Fatalf("claimed %d, want 1", len(rs))
	}
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(rs[0]), Error: "worker lost the upstream"}); err != nil {
		t.Fatal(err)
	}
	if got := e.get("s", "k"); got.State != store.StateUnknown || !samePending(got.Request, &p.Request) {
		t.Fatalf("Get of an asynchronous record gone unknown: %s, request %+v, want %+v", got.State, got.Request, p.Request)
	}
}

// testPendingCleared: the stored request (whose headers may name the
// caller) is kept while a worker may still run it and while an unknown
// outcome waits for whoever settles it, and dropped as soon as the record
// reaches a terminal state, whichever transition takes it there: Get of a
// terminal record returns none.
func testPendingCleared(t *testing.T, h Harness) {
	e := newEnv(t, h)
	q := e.queue()
	held := func(key string) store.Record {
		e.t.Helper()
		e.reservePending(e.pendingP("s", key, "fp", key, store.LeaseUnknown))
		rs := e.claim(q, key, 1)
		if len(rs) != 1 {
			t.Fatalf("claim %s: %d records", key, len(rs))
		}
		return rs[0]
	}
	unknown := func(key string) store.Record {
		e.t.Helper()
		c := held(key)
		if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(c), Error: "timeout"}); err != nil {
			t.Fatal(err)
		}
		if got := e.get("s", key); got.Request == nil {
			t.Fatalf("unknown %s: Get returns no request", key)
		}
		return c
	}
	cleared := func(key, how string) {
		e.t.Helper()
		got := e.get("s", key)
		if !got.State.Terminal() {
			t.Fatalf("%s left %s %s", how, key, got.State)
		}
		if got.Request != nil {
			t.Fatalf("%s kept the stored request of %s: %+v", how, key, got.Request)
		}
	}
	e.complete(held("done"), sampleResponse())
	cleared("done", "Complete")
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(held("released")), Error: "refused"}); err != nil {
		t.Fatal(err)
	}
	cleared("released", "Release")
	resp := sampleResponse()
	for key, to := range map[string]store.State{"resolved": store.StateCompleted, "retried": store.StateFailedRetryable} {
		p := store.ResolveParams{FenceParams: fenceOf(unknown(key)), To: to}
		if to == store.StateCompleted {
			p.Response = &resp
		}
		if err := e.s.Resolve(e.ctx, p); err != nil {
			t.Fatalf("Resolve %s: %v", key, err)
		}
		cleared(key, "Resolve to "+string(to))
	}
	unknown("abandoned")
	e.reservePending(e.pendingP("s", "late", "fp", "late", store.LeaseUnknown))
	e.clock.Advance(ttl)
	timeout := store.Response{Status: http.StatusRequestTimeout}
	if _, err := q.ExpirePending(e.ctx, store.ExpirePendingParams{Limit: 10, Response: timeout}); err != nil {
		t.Fatal(err)
	}
	cleared("late", "ExpirePending")
	e.clock.Advance(h.ReapWidth)
	if _, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 10, Abandoned: timeout, AbandonedTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	cleared("abandoned", "the reaper's abandon")
}
