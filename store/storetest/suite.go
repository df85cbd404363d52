package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

const (
	lease = 30 * time.Second
	ttl   = 24 * time.Hour
)

// env is one test's view: a fresh database, a manual clock, a handle.
type env struct {
	t     *testing.T
	open  Opener
	clock *Clock
	s     store.Store
	ctx   context.Context
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	t.Parallel()
	open := h.NewDatabase(t)
	c := NewClock()
	return &env{t: t, open: open, clock: c, s: open(t, c.Now), ctx: context.Background()}
}

func (e *env) reserveP(scope, key, fp string, policy store.LeasePolicy) store.ReserveParams {
	return store.ReserveParams{Scope: scope, Key: key, Fingerprint: fp, Lease: lease, TTL: ttl, LeasePolicy: policy}
}

func (e *env) reserve(s store.Store, p store.ReserveParams) store.ReserveResult {
	e.t.Helper()
	res, err := s.Reserve(e.ctx, p)
	if err != nil {
		e.t.Fatalf("Reserve(%s/%s): %v", p.Scope, p.Key, err)
	}
	return res
}

func (e *env) get(scope, key string) store.Record {
	e.t.Helper()
	r, err := e.s.Get(e.ctx, scope, key)
	if err != nil {
		e.t.Fatalf("Get(%s/%s): %v", scope, key, err)
	}
	return r
}

// create reserves a fresh record under policy unknown and checks it was created.
func (e *env) create(scope, key, fp string, policy store.LeasePolicy) store.Record {
	e.t.Helper()
	res := e.reserve(e.s, e.reserveP(scope, key, fp, policy))
	if res.Outcome != store.Created {
		e.t.Fatalf("Reserve of a new key: outcome %v, want created", res.Outcome)
	}
	return res.Record
}

// fenceNow names the record with the fence it holds now.
func (e *env) fenceNow(scope, key string) store.FenceParams {
	e.t.Helper()
	return fenceOf(e.get(scope, key))
}

func (e *env) complete(rec store.Record, resp store.Response) {
	e.t.Helper()
	err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(rec), Response: resp})
	if err != nil {
		e.t.Fatalf("Complete: %v", err)
	}
}

func fenceOf(r store.Record) store.FenceParams {
	return store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence}
}

// deferOf is a reconciler's deferral of r as it was listed: its fence and
// the attempts counted so far.
func deferOf(r store.Record, delay time.Duration, why string) store.DeferParams {
	return store.DeferParams{FenceParams: fenceOf(r), Attempts: r.ReconcileAttempts, Delay: delay, Error: why}
}

// deadLetterOf is a reconciler's dead letter of r as it was listed.
func deadLetterOf(r store.Record, why string) store.DeferParams {
	p := deferOf(r, 0, why)
	p.DeadLetter = true
	return p
}

func sampleResponse() store.Response {
	h := http.Header{}
	h.Add("Content-Type", "application/json")
	h.Add("X-Multi", "one")
	h.Add("X-Multi", "two")
	return store.Response{Status: 201, Header: h, Body: []byte(`{"id":"ch_1","amount":100}`)}
}

// diffRecords lists the fields in which a and b differ.
func diffRecords(a, b store.Record) []string {
	var d []string
	add := func(name string, differ bool) {
		if differ {
			d = append(d, name)
		}
	}
	add("Scope", a.Scope != b.Scope)
	add("Key", a.Key != b.Key)
	add("Fingerprint", a.Fingerprint != b.Fingerprint)
	add("State", a.State != b.State)
	add("Fence", a.Fence != b.Fence)
	add("LeasePolicy", a.LeasePolicy != b.LeasePolicy)
	add("LockedUntil", !a.LockedUntil.Equal(b.LockedUntil))
	add("RecoveryPoint", a.RecoveryPoint != b.RecoveryPoint)
	add("Response", !sameResponse(a.Response, b.Response))
	add("LastError", a.LastError != b.LastError)
	add("Attempts", a.Attempts != b.Attempts)
	add("CreatedAt", !a.CreatedAt.Equal(b.CreatedAt))
	add("UpdatedAt", !a.UpdatedAt.Equal(b.UpdatedAt))
	add("CompletedAt", !a.CompletedAt.Equal(b.CompletedAt))
	add("ExpiresAt", !a.ExpiresAt.Equal(b.ExpiresAt))
	add("ReconcileAfter", !a.ReconcileAfter.Equal(b.ReconcileAfter))
	add("ReconcileAttempts", a.ReconcileAttempts != b.ReconcileAttempts)
	add("DeadLetteredAt", !a.DeadLetteredAt.Equal(b.DeadLetteredAt))
	if a.State == b.State && (a.State == store.StateInProgress || a.State == store.StateUnknown) {
		add("Owner", a.Owner != b.Owner) // kept in these states only
	}
	return d
}

func sameResponse(a, b *store.Response) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) && a.BodyOmitted == b.BodyOmitted &&
		sameHeader(a.Header, b.Header)
}

func sameHeader(a, b http.Header) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

func (e *env) mustUnchanged(before store.Record, what string) {
	e.t.Helper()
	after := e.get(before.Scope, before.Key)
	if d := diffRecords(before, after); len(d) > 0 {
		e.t.Fatalf("%s changed the record: fields %v differ\nbefore %+v\nafter  %+v", what, d, before, after)
	}
}

func wantTime(t *testing.T, name string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Fatalf("%s = %v, want %v", name, got, want)
	}
}

func run(t *testing.T, h Harness) {
	if h.NewDatabase == nil {
		t.Fatal("storetest: Harness.NewDatabase is required")
	}
	t.Run("ReserveCreates", func(t *testing.T) { testReserveCreates(t, h) })
	t.Run("LiveLeaseIsExisting", func(t *testing.T) { testLiveLease(t, h) })
	t.Run("FingerprintMismatchTouchesNothing", func(t *testing.T) { testMismatch(t, h) })
	t.Run("CompleteAndReplay", func(t *testing.T) { testCompleteReplay(t, h) })
	t.Run("ResponseRoundTrip", func(t *testing.T) { testResponseRoundTrip(t, h) })
	t.Run("HeadersOfEachAnswer", func(t *testing.T) { testHeadersOfEachAnswer(t, h) })
	t.Run("ScopesAreIndependent", func(t *testing.T) { testScopes(t, h) })
	t.Run("StaleFenceChangesNothing", func(t *testing.T) { testFencing(t, h) })
	t.Run("FenceNeverReusedAcrossDelete", func(t *testing.T) { testFenceAcrossDelete(t, h) })
	t.Run("FenceGrowsWhenClockStepsBack", func(t *testing.T) { testFenceClockBack(t, h) })
	t.Run("ReleaseAndReclaim", func(t *testing.T) { testReleaseReclaim(t, h) })
	t.Run("OwnerOfEachExecution", func(t *testing.T) { testOwner(t, h) })
	t.Run("ConcurrentReserveOneWinner", func(t *testing.T) { testConcurrentReserve(t, h) })
	t.Run("ConcurrentReclaimOneWinner", func(t *testing.T) { testConcurrentReclaim(t, h) })
	t.Run("TwoHandlesOneWinner", func(t *testing.T) { testTwoHandles(t, h) })
	t.Run("MarkUnknown", func(t *testing.T) { testMarkUnknown(t, h) })
	t.Run("MarkUnknownKeepsRequestSummary", func(t *testing.T) { testUnknownSummary(t, h) })
	t.Run("ExpiredLeasePolicyUnknown", func(t *testing.T) { testExpiredUnknown(t, h) })
	t.Run("ExpiredLeasePolicyRetry", func(t *testing.T) { testExpiredRetry(t, h) })
	t.Run("ExpiredLeasePolicyResume", func(t *testing.T) { testExpiredResume(t, h) })
	t.Run("ConcurrentTakeoverOneWinner", func(t *testing.T) { testConcurrentTakeover(t, h) })
	t.Run("ExtendKeepsLease", func(t *testing.T) { testExtend(t, h) })
	t.Run("CheckpointSetsRecoveryPoint", func(t *testing.T) { testCheckpointSets(t, h) })
	t.Run("TerminalPastExpiryIsAbsent", func(t *testing.T) { testTerminalExpiry(t, h) })
	t.Run("Reap", func(t *testing.T) { testReap(t, h) })
	t.Run("ReapSoft", func(t *testing.T) { testReapSoft(t, h) })
	t.Run("ReapBounded", func(t *testing.T) { testReapBounded(t, h) })
	t.Run("ReapSparesLiveLease", func(t *testing.T) { testReapLiveLease(t, h) })
	t.Run("ReapGrace", func(t *testing.T) { testReapGrace(t, h) })
	t.Run("ReapStepsOverSparedRecords", func(t *testing.T) { testReapPastSpared(t, h) })
	t.Run("Sweep", func(t *testing.T) { testSweep(t, h) })
	t.Run("SweepersRaceEachRecordOnce", func(t *testing.T) { testSweepRace(t, h) })
	t.Run("Reconciliation", func(t *testing.T) { testReconcile(t, h) })
	t.Run("ResolveIsBoundToItsFence", func(t *testing.T) { testResolveFence(t, h) })
	t.Run("ResolveSettlesALapsedLeaseUnderItsFence", func(t *testing.T) { testResolveLapsed(t, h) })
	t.Run("GetDelete", func(t *testing.T) { testGetDelete(t, h) })
	t.Run("DeleteIsBoundToItsFence", func(t *testing.T) { testDeleteFence(t, h) })
	t.Run("SurvivesReopen", func(t *testing.T) { testDurable(t, h) })
	t.Run("InvalidParams", func(t *testing.T) { testInvalid(t, h) })
	t.Run("IdentityLimits", func(t *testing.T) { testIdentityLimits(t, h) })
	t.Run("InvalidParamsEveryOperation", func(t *testing.T) { testInvalidEveryOp(t, h) })
	t.Run("DurationsRoundUp", func(t *testing.T) { testRounding(t, h) })
	t.Run("SweepGrace", func(t *testing.T) { testSweepGrace(t, h) })
	t.Run("DeadLetter", func(t *testing.T) { testDeadLetter(t, h) })
	t.Run("ListUnknownOrder", func(t *testing.T) { testListUnknownOrder(t, h) })
	t.Run("ReconcileAttemptsPerExecution", func(t *testing.T) { testReconcileAttemptsPerExecution(t, h) })
	t.Run("DeferIsBoundToItsFence", func(t *testing.T) { testDeferFence(t, h) })
	t.Run("DeferCountsAnAttemptOnce", func(t *testing.T) { testDeferAttempts(t, h) })
	t.Run("DeferNeedsAnUnknownRecord", func(t *testing.T) { testDeferState(t, h) })
	t.Run("ConcurrentDefersCountOnce", func(t *testing.T) { testConcurrentDefer(t, h) })
	t.Run("List", func(t *testing.T) { testList(t, h) })
	t.Run("ListInvalid", func(t *testing.T) { testListInvalid(t, h) })
	t.Run("StoreClock", func(t *testing.T) { testStoreClock(t, h) })
	t.Run("CancelledContext", func(t *testing.T) { testCancelled(t, h) })
	runPending(t, h)
	runCap(t, h)
	t.Run("CountActive", func(t *testing.T) { testCountActive(t, h) })
}

func testReserveCreates(t *testing.T, h Harness) {
	e := newEnv(t, h)
	now := e.clock.Now()
	r := e.create("tenant:POST /charges", "k1", "fp1", store.LeaseUnknown)
	if r.State != store.StateInProgress || r.Fence != now.UnixMicro() || r.Attempts != 1 {
		t.Fatalf("new record: state %s fence %d attempts %d, want in_progress %d 1", r.State, r.Fence, r.Attempts, now.UnixMicro())
	}
	if r.Scope != "tenant:POST /charges" || r.Key != "k1" || r.Fingerprint != "fp1" || r.LeasePolicy != store.LeaseUnknown {
		t.Fatalf("new record identity: %+v", r)
	}
	wantTime(t, "LockedUntil", r.LockedUntil, now.Add(lease))
	wantTime(t, "ExpiresAt", r.ExpiresAt, now.Add(ttl))
	wantTime(t, "CreatedAt", r.CreatedAt, now)
	if r.Response != nil || r.RecoveryPoint != "" || !r.CompletedAt.IsZero() {
		t.Fatalf("new record carries leftovers: %+v", r)
	}
	got := e.get(r.Scope, r.Key)
	if d := diffRecords(r, got); len(d) > 0 {
		t.Fatalf("Get differs from the reserved record in %v", d)
	}
	// Keys are case-sensitive and opaque.
	e.create("tenant:POST /charges", "K1", "fp1", store.LeaseUnknown)
	e.create("tenant:POST /charges", "k1 ", "fp1", store.LeaseUnknown)
}

func testLiveLease(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseRetry)
	e.clock.Advance(lease - time.Microsecond)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseRetry))
	if res.Outcome != store.Existing || res.Record.State != store.StateInProgress || res.Record.Fence != r.Fence {
		t.Fatalf("duplicate during a live lease: %v %s fence %d", res.Outcome, res.Record.State, res.Record.Fence)
	}
	e.mustUnchanged(r, "a duplicate during a live lease")
}

func testMismatch(t *testing.T, h Harness) {
	e := newEnv(t, h)
	inflight := e.create("s", "inflight", "fp", store.LeaseUnknown)
	done := e.create("s", "done", "fp", store.LeaseUnknown)
	e.complete(done, sampleResponse())
	failed := e.create("s", "failed", "fp", store.LeaseUnknown)
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(failed), Error: "upstream 503"}); err != nil {
		t.Fatal(err)
	}
	unknown := e.create("s", "unknown", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(unknown), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	expiredRetry := e.create("s", "expired", "fp", store.LeaseRetry)
	_ = inflight
	_ = expiredRetry
	e.clock.Advance(time.Second)
	for _, key := range []string{"inflight", "done", "failed", "unknown"} {
		before := e.get("s", key)
		res := e.reserve(e.s, e.reserveP("s", key, "other", store.LeaseUnknown))
		if res.Outcome != store.Existing || res.Record.Fingerprint != "fp" {
			t.Fatalf("%s: mismatched reserve: outcome %v fingerprint %q", key, res.Outcome, res.Record.Fingerprint)
		}
		e.mustUnchanged(before, "a mismatched reserve on "+key)
	}
	// Even with an expired takeover-able lease, a different request never takes it over.
	e.clock.Advance(lease)
	before := e.get("s", "expired")
	res := e.reserve(e.s, e.reserveP("s", "expired", "other", store.LeaseRetry))
	if res.Outcome != store.Existing || res.Record.Fingerprint != "fp" {
		t.Fatalf("mismatch on an expired lease: outcome %v fingerprint %q", res.Outcome, res.Record.Fingerprint)
	}
	e.mustUnchanged(before, "a mismatched reserve on an expired lease")
}

func testCompleteReplay(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	e.clock.Advance(time.Second)
	done := e.clock.Now()
	resp := sampleResponse()
	e.complete(r, resp)
	got := e.get("s", "k")
	if got.State != store.StateCompleted || got.Fence != r.Fence || !sameResponse(got.Response, &resp) {
		t.Fatalf("completed record: state %s fence %d response %+v", got.State, got.Fence, got.Response)
	}
	wantTime(t, "CompletedAt", got.CompletedAt, done)
	wantTime(t, "ExpiresAt (kept from reserve)", got.ExpiresAt, r.ExpiresAt)
	e.clock.Advance(time.Hour)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown))
	if res.Outcome != store.Existing || res.Record.State != store.StateCompleted || !sameResponse(res.Record.Response, &resp) {
		t.Fatalf("replay: %v %s %+v", res.Outcome, res.Record.State, res.Record.Response)
	}
	e.mustUnchanged(got, "a replay")
	// A second Complete by the same holder is refused: the record left in_progress.
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(r), Response: resp}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second Complete: %v, want ErrLeaseLost", err)
	}
	// Completion with a TTL restarts the retention window.
	r2 := e.create("s", "k2", "fp", store.LeaseUnknown)
	e.clock.Advance(time.Minute)
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(r2), Response: resp, TTL: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	wantTime(t, "ExpiresAt after Complete with TTL", e.get("s", "k2").ExpiresAt, e.clock.Now().Add(2*time.Hour))
}

func testResponseRoundTrip(t *testing.T, h Harness) {
	e := newEnv(t, h)
	big := bytes.Repeat([]byte{0, 1, 2, 0xff, 'x'}, 1<<18) // 1.25 MiB, binary
	cases := []store.Response{
		{Status: 200, Body: []byte{}},
		{Status: 204},
		{Status: 201, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: big},
		{Status: 200, Header: http.Header{"X-A": {"1", "2", "3"}, "Location": {"/v1/charges/ch_1?x=ü"}}, Body: []byte("héllo\x00")},
		{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true},
	}
	for i, resp := range cases {
		r := e.create("s", fmt.Sprint("k", i), "fp", store.LeaseUnknown)
		e.complete(r, resp)
		got := e.get(r.Scope, r.Key).Response
		if got == nil || got.Status != resp.Status || !bytes.Equal(got.Body, resp.Body) ||
			got.BodyOmitted != resp.BodyOmitted || !sameHeader(got.Header, resp.Header) {
			t.Fatalf("case %d: stored %+v came back as %+v", i, resp, got)
		}
	}
}

// testHeadersOfEachAnswer checks that every completed record replays the
// headers of its own answer, exactly, whatever answers were stored just
// before it: one with the same headers plus another, or fewer.
func testHeadersOfEachAnswer(t *testing.T, h Harness) {
	e := newEnv(t, h)
	headers := []http.Header{
		{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}},
		{"Content-Type": {"application/json"}},
		{"Content-Type": {"application/json"}, "X-Multi": {"one", "two"}},
		{"X-Multi": {"one"}},
		{"Content-Type": {"application/json"}},
		{},
	}
	for i, hdr := range headers {
		r := e.create("s", fmt.Sprint("k", i), "fp", store.LeaseUnknown)
		e.complete(r, store.Response{Status: 201, Header: hdr, Body: []byte(`{}`)})
	}
	for i, hdr := range headers {
		if got := e.get("s", fmt.Sprint("k", i)).Response; got == nil || !sameHeader(got.Header, hdr) {
			t.Fatalf("answer %d stored with header %v came back as %+v", i, hdr, got)
		}
	}
}

func testScopes(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a := e.create("tenant-a:POST /x", "same", "fp-a", store.LeaseUnknown)
	b := e.create("tenant-b:POST /x", "same", "fp-b", store.LeaseUnknown)
	e.complete(a, store.Response{Status: 201, Body: []byte("a")})
	if got := e.get(b.Scope, b.Key); got.State != store.StateInProgress || got.Fingerprint != "fp-b" {
		t.Fatalf("completing in scope a changed scope b: %+v", got)
	}
	// Scope and key are not concatenated ambiguously.
	e.create("ab", "c", "fp", store.LeaseUnknown)
	e.create("a", "bc", "fp", store.LeaseUnknown)
	e.create("a:b", "c", "fp", store.LeaseUnknown)
	e.create("a", "b:c", "fp", store.LeaseUnknown)
}

func testFencing(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseRetry)
	stale := fenceOf(r)
	stale.Fence = r.Fence + 1
	ops := map[string]func() error{
		"Complete": func() error {
			return e.s.Complete(e.ctx, store.CompleteParams{FenceParams: stale, Response: sampleResponse()})
		},
		"Release":     func() error { return e.s.Release(e.ctx, store.ReleaseParams{FenceParams: stale, Error: "x"}) },
		"MarkUnknown": func() error { return e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: stale, Error: "x"}) },
		"Checkpoint": func() error {
			return e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: stale, RecoveryPoint: "p"})
		},
		"Extend": func() error { return e.s.Extend(e.ctx, store.ExtendParams{FenceParams: stale, Lease: time.Hour}) },
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("%s with a wrong fence: %v, want ErrLeaseLost", name, err)
		}
		e.mustUnchanged(r, name+" with a wrong fence")
	}
	// A real takeover: the old holder's fence is now stale.
	e.clock.Advance(lease)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseRetry))
	if res.Outcome != store.TakenOver || res.Record.Fence != e.clock.Now().UnixMicro() {
		t.Fatalf("takeover: %v fence %d, want the clock's %d", res.Outcome, res.Record.Fence, e.clock.Now().UnixMicro())
	}
	old := fenceOf(r)
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: old, Response: sampleResponse()}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("old holder Complete after takeover: %v, want ErrLeaseLost", err)
	}
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: old, Error: "x"}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("old holder Release after takeover: %v, want ErrLeaseLost", err)
	}
	e.mustUnchanged(res.Record, "the old holder after a takeover")
	// Operations on a missing record are lease-lost too.
	missing := store.FenceParams{Scope: "s", Key: "missing", Fence: 1}
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: missing, Response: sampleResponse()}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete of a missing record: %v, want ErrLeaseLost", err)
	}
	if _, err := e.s.Get(e.ctx, "s", "missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Complete of a missing record created it: %v", err)
	}
}

func testReleaseReclaim(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	if err := e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: fenceOf(r), RecoveryPoint: "charged"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "upstream refused"}); err != nil {
		t.Fatal(err)
	}
	got := e.get("s", "k")
	if got.State != store.StateFailedRetryable || got.LastError != "upstream refused" || got.Response != nil {
		t.Fatalf("released record: %+v", got)
	}
	e.clock.Advance(time.Second)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown))
	if res.Outcome != store.Reclaimed || res.Record.Fence != e.clock.Now().UnixMicro() || res.Record.Attempts != 2 || res.Record.State != store.StateInProgress {
		t.Fatalf("reclaim: %v fence %d attempts %d state %s", res.Outcome, res.Record.Fence, res.Record.Attempts, res.Record.State)
	}
	wantTime(t, "LockedUntil after reclaim", res.Record.LockedUntil, e.clock.Now().Add(lease))
	wantTime(t, "ExpiresAt after reclaim", res.Record.ExpiresAt, e.clock.Now().Add(ttl))
	if res.Record.LastError != "" || res.Record.RecoveryPoint != "charged" || res.Record.LeasePolicy != store.LeaseUnknown {
		t.Fatalf("after reclaim: LastError %q, RecoveryPoint %q, LeasePolicy %q; want empty, kept, kept",
			res.Record.LastError, res.Record.RecoveryPoint, res.Record.LeasePolicy)
	}
	wantTime(t, "CreatedAt after reclaim", res.Record.CreatedAt, r.CreatedAt)
	e.complete(res.Record, sampleResponse())
	if got := e.get("s", "k"); got.State != store.StateCompleted {
		t.Fatalf("after reclaim and complete: %s", got.State)
	}
}

// testOwner: the Reserve that starts an execution (creation, reclaim,
// takeover, replacement of an expired record) stores its Owner, which the
// record keeps while in progress and once unknown; no other Reserve
// changes it, its own included.
func testOwner(t *testing.T, h Harness) {
	e := newEnv(t, h)
	owned := func(key, fp string, policy store.LeasePolicy, owner int64) store.ReserveParams {
		p := e.reserveP("s", key, fp, policy)
		p.Owner = owner
		return p
	}
	want := func(what string, r store.Record, owner int64) {
		t.Helper()
		if r.Owner != owner {
			t.Fatalf("%s: Owner %d, want %d", what, r.Owner, owner)
		}
		if got := e.get(r.Scope, r.Key); got.Owner != owner {
			t.Fatalf("%s: Get's Owner %d, want %d", what, got.Owner, owner)
		}
	}
	created := e.reserve(e.s, owned("k", "fp", store.LeaseUnknown, 7))
	if created.Outcome != store.Created {
		t.Fatalf("new key: %v", created.Outcome)
	}
	want("created", created.Record, 7)
	// Duplicates, its own Owner's too, leave it as it is.
	for _, owner := range []int64{8, 7, 0, -7} {
		res := e.reserve(e.s, owned("k", "fp", store.LeaseUnknown, owner))
		if res.Outcome != store.Existing || res.Record.Owner != 7 {
			t.Fatalf("duplicate with Owner %d: %v, Owner %d", owner, res.Outcome, res.Record.Owner)
		}
		e.mustUnchanged(created.Record, "a duplicate's Reserve")
	}
	if res := e.reserve(e.s, owned("k", "other", store.LeaseUnknown, 9)); res.Outcome != store.Existing || res.Record.Owner != 7 {
		t.Fatalf("another request: %v, Owner %d", res.Outcome, res.Record.Owner)
	}
	// A reclaim is a new execution: the reclaiming Reserve's Owner.
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(created.Record), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	reclaimed := e.reserve(e.s, owned("k", "fp", store.LeaseUnknown, 10))
	if reclaimed.Outcome != store.Reclaimed {
		t.Fatalf("reclaim: %v", reclaimed.Outcome)
	}
	want("reclaimed", reclaimed.Record, 10)
	// Past the lease under policy unknown the record keeps the Owner of
	// the execution whose outcome is unknown.
	e.clock.Advance(lease)
	res := e.reserve(e.s, owned("k", "fp", store.LeaseUnknown, 11))
	if res.Outcome != store.Existing || res.Record.State != store.StateUnknown {
		t.Fatalf("after the lease (policy unknown): %v %s", res.Outcome, res.Record.State)
	}
	want("unknown after the lease", res.Record, 10)
	// So do the lease holder's Checkpoint and Extend, MarkUnknown, and a
	// reconciler's Defer of the unknown record.
	m := e.reserve(e.s, owned("m", "fp", store.LeaseUnknown, -12))
	if err := e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: fenceOf(m.Record), RecoveryPoint: "charged"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(m.Record), Lease: lease}); err != nil {
		t.Fatal(err)
	}
	want("checkpointed and extended", e.get("s", "m"), -12)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(m.Record), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	want("marked unknown", e.get("s", "m"), -12)
	if err := e.s.Defer(e.ctx, deferOf(e.get("s", "m"), time.Minute, "provider 500")); err != nil {
		t.Fatal(err)
	}
	want("deferred", e.get("s", "m"), -12)
	// A takeover is a new execution.
	r := e.reserve(e.s, owned("r", "fp", store.LeaseRetry, 13))
	want("created under policy retry", r.Record, 13)
	e.clock.Advance(lease)
	took := e.reserve(e.s, owned("r", "fp", store.LeaseRetry, 14))
	if took.Outcome != store.TakenOver {
		t.Fatalf("takeover: %v", took.Outcome)
	}
	want("taken over", took.Record, 14)
	// So is the record that replaces an expired one; 0 is an Owner too.
	e.complete(took.Record, sampleResponse())
	e.clock.Advance(ttl)
	again := e.reserve(e.s, owned("r", "fp", store.LeaseRetry, 0))
	if again.Outcome != store.Created {
		t.Fatalf("past expiry: %v", again.Outcome)
	}
	want("created over an expired record", again.Record, 0)
	big := e.reserve(e.s, owned("big", "fp", store.LeaseRetry, math.MinInt64))
	want("the smallest Owner", big.Record, math.MinInt64)
	big = e.reserve(e.s, owned("big2", "fp", store.LeaseRetry, math.MaxInt64))
	want("the largest Owner", big.Record, math.MaxInt64)
}

// race runs n goroutines released at once and returns their outcomes.
func race(t *testing.T, n int, f func(i int) (store.ReserveResult, error)) []store.ReserveResult {
	t.Helper()
	out := make([]store.ReserveResult, n)
	errs := make([]error, n)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := 0; i < n; i++ {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			out[i], errs[i] = f(i)
		}()
	}
	start.Done()
	done.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("racer %d: %v", i, err)
		}
	}
	return out
}

func countOutcomes(res []store.ReserveResult, want store.ReserveOutcome) int {
	n := 0
	for _, r := range res {
		if r.Outcome == want {
			n++
		}
	}
	return n
}

func testConcurrentReserve(t *testing.T, h Harness) {
	e := newEnv(t, h)
	for round := 0; round < 10; round++ {
		key := fmt.Sprint("race-", round)
		res := race(t, 64, func(int) (store.ReserveResult, error) {
			return e.s.Reserve(e.ctx, e.reserveP("s", key, "fp", store.LeaseUnknown))
		})
		if n := countOutcomes(res, store.Created); n != 1 {
			t.Fatalf("round %d: %d winners of 64, want 1", round, n)
		}
		want := e.clock.Now().UnixMicro()
		for _, r := range res {
			if r.Outcome == store.Existing && (r.Record.State != store.StateInProgress || r.Record.Fence != want) {
				t.Fatalf("round %d: loser saw %s fence %d, want in_progress %d", round, r.Record.State, r.Record.Fence, want)
			}
		}
	}
}

func testConcurrentReclaim(t *testing.T, h Harness) {
	e := newEnv(t, h)
	for round := 0; round < 5; round++ {
		key := fmt.Sprint("reclaim-", round)
		r := e.create("s", key, "fp", store.LeaseUnknown)
		if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "x"}); err != nil {
			t.Fatal(err)
		}
		res := race(t, 64, func(int) (store.ReserveResult, error) {
			return e.s.Reserve(e.ctx, e.reserveP("s", key, "fp", store.LeaseUnknown))
		})
		if n := countOutcomes(res, store.Reclaimed); n != 1 {
			t.Fatalf("round %d: %d reclaims of 64, want 1", round, n)
		}
		// The clock did not move: the fence still grows by one.
		if got := e.get("s", key); got.Fence != r.Fence+1 || got.Attempts != 2 {
			t.Fatalf("round %d: after the reclaim race fence %d attempts %d, want %d 2", round, got.Fence, got.Attempts, r.Fence+1)
		}
	}
}

func testTwoHandles(t *testing.T, h Harness) {
	if !h.Shared {
		t.Skip("storetest: this store's handles do not share a database (not Shared)")
	}
	e := newEnv(t, h)
	other := e.open(t, e.clock.Now)
	handles := []store.Store{e.s, other}
	for round := 0; round < 10; round++ {
		key := fmt.Sprint("two-", round)
		res := race(t, 64, func(i int) (store.ReserveResult, error) {
			return handles[i%2].Reserve(e.ctx, e.reserveP("s", key, "fp", store.LeaseUnknown))
		})
		if n := countOutcomes(res, store.Created); n != 1 {
			t.Fatalf("round %d: %d winners across two handles, want 1", round, n)
		}
	}
	// What one handle completes, the other replays.
	r := e.create("s", "cross", "fp", store.LeaseUnknown)
	e.complete(r, sampleResponse())
	res := e.reserve(other, e.reserveP("s", "cross", "fp", store.LeaseUnknown))
	if res.Outcome != store.Existing || res.Record.State != store.StateCompleted {
		t.Fatalf("other handle: %v %s", res.Outcome, res.Record.State)
	}
}

func testMarkUnknown(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseRetry)
	e.clock.Advance(time.Second)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "gateway timeout"}); err != nil {
		t.Fatal(err)
	}
	got := e.get("s", "k")
	if got.State != store.StateUnknown || got.LastError != "gateway timeout" {
		t.Fatalf("after MarkUnknown: %+v", got)
	}
	wantTime(t, "ReconcileAfter", got.ReconcileAfter, e.clock.Now())
	// No client retry re-executes an unknown record, not even long after.
	e.clock.Advance(10 * lease)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseRetry))
	if res.Outcome != store.Existing || res.Record.State != store.StateUnknown {
		t.Fatalf("retry of an unknown record: %v %s", res.Outcome, res.Record.State)
	}
	e.mustUnchanged(got, "a retry of an unknown record")
}

// summary is a request summary as the engine gives MarkUnknown.
func summary(fence int64) *store.PendingRequest {
	h := http.Header{}
	h.Add("Content-Type", "application/json")
	h.Add("X-Multi", "one")
	h.Add("X-Multi", "two")
	return &store.PendingRequest{Method: "POST", Target: "/v1/charges?x=1&y=%20", Header: h,
		Body: []byte("{\"amount\":100,\"bin\":\"\x00\xff"), BodyBytes: 4096, Fence: fence}
}

func sameSummary(a, b *store.PendingRequest) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Queue == b.Queue && a.Method == b.Method && a.Target == b.Target && string(a.Body) == string(b.Body) &&
		sameHeader(a.Header, b.Header) && a.BodyBytes == b.BodyBytes && a.Fence == b.Fence
}

// A record marked unknown keeps the summary of its request it was given,
// and Get returns it, for the operator who settles it; without one, Get
// returns none. A summary the contract refuses changes nothing.
func testUnknownSummary(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	sum := summary(r.Fence)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "upstream hung up", Request: sum}); err != nil {
		t.Fatal(err)
	}
	got := e.get("s", "k")
	if got.State != store.StateUnknown || !sameSummary(got.Request, sum) {
		t.Fatalf("Get of a record marked unknown with a summary: %s, request %+v, want %+v", got.State, got.Request, sum)
	}
	plain := e.create("s", "plain", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(plain), Error: "declared"}); err != nil {
		t.Fatal(err)
	}
	if got := e.get("s", "plain"); got.State != store.StateUnknown || got.Request != nil {
		t.Fatalf("Get of a record marked unknown without a summary: %s, request %+v", got.State, got.Request)
	}

	held := e.create("s", "held", "fp", store.LeaseUnknown)
	queued := summary(held.Fence)
	queued.Queue = "q"
	big := summary(held.Fence)
	big.Body = make([]byte, store.MaxRequestSummaryBytes)
	badMethod := summary(held.Fence)
	badMethod.Method = "PO ST"
	for _, c := range []struct {
		name string
		req  *store.PendingRequest
		want error
	}{{"a queue", queued, store.ErrInvalidParams}, {"too large", big, store.ErrTooLong}, {"a bad method", badMethod, store.ErrInvalidParams}} {
		err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(held), Request: c.req})
		if !errors.Is(err, c.want) {
			t.Fatalf("MarkUnknown with a summary with %s: %v, want %v", c.name, err, c.want)
		}
	}
	e.mustUnchanged(held, "refused summaries")
	if got := e.get("s", "held"); got.State != store.StateInProgress {
		t.Fatalf("a refused summary moved the record to %s", got.State)
	}
}

func testExpiredUnknown(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	e.clock.Advance(lease)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown))
	if res.Outcome != store.Existing || res.Record.State != store.StateUnknown || res.Record.LastError != "lease_expired" {
		t.Fatalf("retry after the lease expired (policy unknown): %v %s %q", res.Outcome, res.Record.State, res.Record.LastError)
	}
	wantTime(t, "ReconcileAfter", res.Record.ReconcileAfter, e.clock.Now())
	if res.Record.Fence != r.Fence {
		t.Fatalf("moving to unknown changed the fence to %d", res.Record.Fence)
	}
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(r), Response: sampleResponse()}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("late Complete of the dead holder: %v, want ErrLeaseLost", err)
	}
	// The request-side policy does not override the record's own policy.
	r2 := e.create("s", "k2", "fp", store.LeaseUnknown)
	_ = r2
	e.clock.Advance(lease)
	res = e.reserve(e.s, e.reserveP("s", "k2", "fp", store.LeaseRetry))
	if res.Outcome != store.Existing || res.Record.State != store.StateUnknown {
		t.Fatalf("record policy unknown, request policy retry: %v %s", res.Outcome, res.Record.State)
	}
}

func testExpiredRetry(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseRetry)
	if err := e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: fenceOf(r), RecoveryPoint: "charged"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(lease)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseRetry))
	if res.Outcome != store.TakenOver || res.Record.Fence != e.clock.Now().UnixMicro() || res.Record.Attempts != 2 || res.Record.State != store.StateInProgress {
		t.Fatalf("takeover: %v fence %d attempts %d %s", res.Outcome, res.Record.Fence, res.Record.Attempts, res.Record.State)
	}
	wantTime(t, "LockedUntil after takeover", res.Record.LockedUntil, e.clock.Now().Add(lease))
	e.complete(res.Record, sampleResponse())
	if got := e.get("s", "k"); got.State != store.StateCompleted || got.Fence != res.Record.Fence {
		t.Fatalf("after the new holder completed: %s fence %d", got.State, got.Fence)
	}
}

func testExpiredResume(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseResume)
	for _, p := range []string{"ride_created", "charge_created"} {
		if err := e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: fenceOf(r), RecoveryPoint: p}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.get("s", "k"); got.RecoveryPoint != "charge_created" {
		t.Fatalf("RecoveryPoint = %q", got.RecoveryPoint)
	}
	e.clock.Advance(lease + time.Second)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseResume))
	if res.Outcome != store.TakenOver || res.Record.RecoveryPoint != "charge_created" || res.Record.Fence != e.clock.Now().UnixMicro() {
		t.Fatalf("resume takeover: %v point %q fence %d", res.Outcome, res.Record.RecoveryPoint, res.Record.Fence)
	}
	if err := e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: fenceOf(r), RecoveryPoint: "finished"}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("dead holder's Checkpoint: %v, want ErrLeaseLost", err)
	}
}

func testConcurrentTakeover(t *testing.T, h Harness) {
	e := newEnv(t, h)
	for round := 0; round < 5; round++ {
		key := fmt.Sprint("takeover-", round)
		e.create("s", key, "fp", store.LeaseRetry)
		e.clock.Advance(lease)
		res := race(t, 64, func(int) (store.ReserveResult, error) {
			return e.s.Reserve(e.ctx, e.reserveP("s", key, "fp", store.LeaseRetry))
		})
		if n := countOutcomes(res, store.TakenOver); n != 1 {
			t.Fatalf("round %d: %d takeovers of 64, want 1", round, n)
		}
		if got := e.get("s", key); got.Fence != e.clock.Now().UnixMicro() {
			t.Fatalf("round %d: fence %d after the takeover race, want %d", round, got.Fence, e.clock.Now().UnixMicro())
		}
	}
}

func testExtend(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseRetry)
	e.clock.Advance(lease - time.Second)
	if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(r), Lease: lease}); err != nil {
		t.Fatal(err)
	}
	wantTime(t, "LockedUntil after Extend", e.get("s", "k").LockedUntil, e.clock.Now().Add(lease))
	e.clock.Advance(lease - time.Second) // past the first lease, inside the renewed one
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseRetry))
	if res.Outcome != store.Existing || res.Record.State != store.StateInProgress {
		t.Fatalf("renewed lease taken over: %v %s", res.Outcome, res.Record.State)
	}
	e.complete(r, sampleResponse())
}

// testCheckpointSets checks that Checkpoint sets the recovery point to the
// value given, an empty one included: a holder that starts its phases over
// clears the point, so that a resuming takeover does not skip them.
func testCheckpointSets(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseResume)
	for _, p := range []string{"charged", "", "refunded", ""} {
		if err := e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: fenceOf(r), RecoveryPoint: p}); err != nil {
			t.Fatal(err)
		}
		if got := e.get("s", "k").RecoveryPoint; got != p {
			t.Fatalf("RecoveryPoint after Checkpoint(%q) = %q", p, got)
		}
	}
	e.clock.Advance(lease + time.Second)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseResume))
	if res.Outcome != store.TakenOver || res.Record.RecoveryPoint != "" {
		t.Fatalf("resume takeover: %v point %q, want taken over from the start", res.Outcome, res.Record.RecoveryPoint)
	}
}

func testTerminalExpiry(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	e.complete(r, sampleResponse())
	f := e.create("s", "f", "fp", store.LeaseUnknown)
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(f), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(ttl - time.Microsecond)
	if res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown)); res.Outcome != store.Existing {
		t.Fatalf("inside the retention window: %v", res.Outcome)
	}
	e.clock.Advance(time.Microsecond)
	// Past ExpiresAt a terminal record is absent, whatever the fingerprint.
	res := e.reserve(e.s, e.reserveP("s", "k", "new-fp", store.LeaseUnknown))
	if res.Outcome != store.Created || res.Record.Fingerprint != "new-fp" || res.Record.Response != nil ||
		res.Record.Fence != e.clock.Now().UnixMicro() || res.Record.Attempts != 1 || res.Record.State != store.StateInProgress {
		t.Fatalf("past expiry: %v %+v", res.Outcome, res.Record)
	}
	wantTime(t, "ExpiresAt of the new record", res.Record.ExpiresAt, e.clock.Now().Add(ttl))
	wantTime(t, "CreatedAt of the new record", res.Record.CreatedAt, e.clock.Now())
	res = e.reserve(e.s, e.reserveP("s", "f", "fp", store.LeaseUnknown))
	if res.Outcome != store.Created || res.Record.Attempts != 1 {
		t.Fatalf("failed_retryable past expiry: %v attempts %d", res.Outcome, res.Record.Attempts)
	}
	// In-progress and unknown records never expire into absence on Reserve.
	u := e.create("s", "u", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(u), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * ttl)
	if res := e.reserve(e.s, e.reserveP("s", "u", "fp", store.LeaseUnknown)); res.Outcome != store.Existing || res.Record.State != store.StateUnknown {
		t.Fatalf("unknown past expiry: %v %s", res.Outcome, res.Record.State)
	}
}

var abandoned = store.Response{
	Status: 504,
	Header: http.Header{"Content-Type": {"application/problem+json"}},
	Body:   []byte(`{"type":"abandoned"}`),
}

func testReap(t *testing.T, h Harness) {
	e := newEnv(t, h)
	done := e.create("s", "done", "fp", store.LeaseUnknown)
	e.complete(done, sampleResponse())
	failed := e.create("s", "failed", "fp", store.LeaseUnknown)
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(failed), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	stuck := e.create("s", "stuck", "fp", store.LeaseRetry)
	unk := e.create("s", "unknown", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(unk), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(ttl / 2)
	young := e.create("s", "young", "fp", store.LeaseUnknown)
	e.complete(young, sampleResponse())
	live := e.create("s", "live", "fp", store.LeaseUnknown)

	p := store.ReapParams{Limit: 100, Abandoned: abandoned, AbandonedTTL: time.Hour}
	if res, err := e.s.Reap(e.ctx, p); err != nil || res != (store.ReapResult{}) {
		t.Fatalf("Reap before anything expired: %+v %v", res, err)
	}
	e.clock.Advance(ttl/2 + h.ReapWidth)
	res, err := e.s.Reap(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 2 || res.Abandoned != 2 {
		t.Fatalf("Reap: %+v, want 2 deleted and 2 abandoned", res)
	}
	for _, k := range []string{"done", "failed"} {
		if _, err := e.s.Get(e.ctx, "s", k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s after Reap: %v, want ErrNotFound", k, err)
		}
	}
	for _, k := range []string{"stuck", "unknown"} {
		got := e.get("s", k)
		if got.State != store.StateCompleted || got.LastError != "abandoned" || !sameResponse(got.Response, &abandoned) {
			t.Fatalf("%s after Reap: %+v", k, got)
		}
		wantTime(t, k+" ExpiresAt", got.ExpiresAt, e.clock.Now().Add(time.Hour))
	}
	_ = stuck
	e.mustUnchanged(e.get("s", "young"), "Reap")
	if got := e.get("s", "live"); got.State != store.StateInProgress {
		t.Fatalf("Reap touched a live record: %s", got.State)
	}
	_ = live
	// The abandoned holder cannot complete afterwards.
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(stuck), Response: sampleResponse()}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete after abandonment: %v", err)
	}
}

func testReapSoft(t *testing.T, h Harness) {
	e := newEnv(t, h)
	done := e.create("s", "done", "fp", store.LeaseUnknown)
	e.complete(done, sampleResponse())
	e.clock.Advance(ttl)
	res, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 10, Soft: true, Abandoned: abandoned, AbandonedTTL: time.Hour})
	if err != nil || res.Deleted != 1 {
		t.Fatalf("soft Reap: %+v %v", res, err)
	}
	got := e.get("s", "done")
	if got.State != store.StateExpired {
		t.Fatalf("soft-reaped record: %s, want expired", got.State)
	}
	// Reaping again does not count it twice.
	if res, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 10, Soft: true, Abandoned: abandoned, AbandonedTTL: time.Hour}); err != nil || res.Deleted != 0 {
		t.Fatalf("second soft Reap: %+v %v", res, err)
	}
	r := e.reserve(e.s, e.reserveP("s", "done", "other", store.LeaseUnknown))
	if r.Outcome != store.Created || r.Record.Fence != e.clock.Now().UnixMicro() || r.Record.Fence <= done.Fence {
		t.Fatalf("Reserve over an expired record: %v fence %d", r.Outcome, r.Record.Fence)
	}
}

func testReapBounded(t *testing.T, h Harness) {
	e := newEnv(t, h)
	for i := 0; i < 10; i++ {
		r := e.create("s", fmt.Sprint("k", i), "fp", store.LeaseUnknown)
		e.complete(r, sampleResponse())
	}
	e.clock.Advance(ttl + h.ReapWidth)
	total := 0
	for i := 0; i < 10; i++ {
		res, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 3, Abandoned: abandoned, AbandonedTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if h.ReapWidth == 0 && res.Deleted+res.Abandoned > 3 {
			t.Fatalf("Reap with Limit 3 changed %d records", res.Deleted+res.Abandoned)
		}
		total += res.Deleted
		if res.Deleted == 0 {
			break
		}
	}
	if total != 10 {
		t.Fatalf("batched Reap deleted %d of 10", total)
	}
}

func testReapLiveLease(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "long", "fp", store.LeaseUnknown)
	e.clock.Advance(ttl - time.Second)
	// The holder is alive: it renews its lease past the record's expiry.
	if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(r), Lease: lease}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second)
	p := store.ReapParams{Limit: 10, Abandoned: abandoned, AbandonedTTL: time.Hour}
	if res, err := e.s.Reap(e.ctx, p); err != nil || res != (store.ReapResult{}) {
		t.Fatalf("Reap of a record whose holder is alive: %+v %v", res, err)
	}
	e.clock.Advance(lease + h.ReapWidth)
	if res, err := e.s.Reap(e.ctx, p); err != nil || res.Abandoned != 1 {
		t.Fatalf("Reap once the holder died: %+v %v", res, err)
	}
}

// testReapGrace: like the sweeper, the reaper spares an in_progress record
// past its expiry whose lease ended less than Grace ago (its holder may be
// alive, renewing once the store answers again); an unknown record is
// abandoned at its expiry whatever the grace.
func testReapGrace(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const grace = 10 * time.Second
	r := e.create("s", "long", "fp", store.LeaseUnknown)
	e.unknownRecord("unknown")
	e.clock.Advance(ttl - time.Second)
	if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(r), Lease: lease + h.ReapWidth}); err != nil {
		t.Fatal(err)
	}
	r = e.get("s", "long")
	reap := func(want int) {
		t.Helper()
		res, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 10, Grace: grace, Abandoned: abandoned, AbandonedTTL: time.Hour})
		if err != nil || res.Abandoned != want {
			t.Fatalf("Reap with grace at %v past the lease's end: %+v %v, want %d abandoned",
				e.clock.Now().Sub(r.LockedUntil), res, err, want)
		}
	}
	e.clock.Advance(lease + h.ReapWidth)
	reap(1)
	if got := e.get("s", "unknown"); got.State != store.StateCompleted || got.LastError != "abandoned" {
		t.Fatalf("unknown record past expiry under a grace: %s %q", got.State, got.LastError)
	}
	e.clock.Advance(grace - time.Microsecond)
	reap(0)
	e.mustUnchanged(r, "Reap inside the grace")
	e.clock.Advance(time.Microsecond + h.ReapWidth)
	reap(1)
	if got := e.get("s", "long"); got.State != store.StateCompleted || got.LastError != "abandoned" {
		t.Fatalf("in_progress record once the grace passed: %s %q", got.State, got.LastError)
	}
}

// testReapPastSpared: the in_progress records a grace spares take no place
// in a batch. With spared records first in expiry order and reapable ones
// after them, a Reap whose Limit is the number of reapable records changes
// them all (a batch shorter than Limit tells the caller that nothing is
// left for now), and leaves the spared ones as they were.
func testReapPastSpared(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const spared = 7
	grace := time.Minute + h.ReapWidth
	var held []store.Record
	for i := range spared {
		held = append(held, e.create("s", fmt.Sprint("held", i), "fp", store.LeaseUnknown))
	}
	e.clock.Advance(lease)
	// Reapable once their expiry passed: two terminal records and an
	// unknown one, expiring after the spared records' leases end.
	for _, k := range []string{"done", "failed"} {
		r := e.create("s", k, "fp", store.LeaseUnknown)
		if k == "done" {
			e.complete(r, sampleResponse())
		} else if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	e.unknownRecord("unknown")
	const reapable = 3
	// The holders renew their leases past their records' expiry, then
	// stop: their leases end a second before the reapable records expire.
	e.clock.Advance(ttl - lease - time.Second)
	for i, r := range held {
		if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(r), Lease: lease}); err != nil {
			t.Fatal(err)
		}
		held[i] = e.get("s", r.Key)
	}
	e.clock.Advance(lease + time.Second + h.ReapWidth)
	p := store.ReapParams{Limit: reapable, Grace: grace, Abandoned: abandoned, AbandonedTTL: ttl}
	res, err := e.s.Reap(e.ctx, p)
	if err != nil || res.Deleted != 2 || res.Abandoned != 1 {
		t.Fatalf("Reap(Limit %d) behind %d spared records: %+v %v, want 2 deleted and 1 abandoned", reapable, spared, res, err)
	}
	for _, k := range []string{"done", "failed"} {
		if _, err := e.s.Get(e.ctx, "s", k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s after Reap: %v, want ErrNotFound", k, err)
		}
	}
	if got := e.get("s", "unknown"); got.State != store.StateCompleted || got.LastError != "abandoned" {
		t.Fatalf("unknown record after Reap: %s %q", got.State, got.LastError)
	}
	for _, r := range held {
		e.mustUnchanged(r, "Reap inside the grace")
	}
	if res, err := e.s.Reap(e.ctx, p); err != nil || res != (store.ReapResult{}) {
		t.Fatalf("Reap with only spared records left: %+v %v", res, err)
	}
	// Once the grace passed, the spared records are abandoned in turn.
	e.clock.Advance(grace)
	p.Limit = spared
	if res, err := e.s.Reap(e.ctx, p); err != nil || res != (store.ReapResult{Abandoned: spared}) {
		t.Fatalf("Reap once the grace passed: %+v %v, want %d abandoned", res, err, spared)
	}
}

func testSweep(t *testing.T, h Harness) {
	e := newEnv(t, h)
	var zombies []store.Record
	for i := 0; i < 5; i++ {
		zombies = append(zombies, e.create("s", fmt.Sprint("z", i), "fp", store.LeaseUnknown))
	}
	retry := e.create("s", "retry", "fp", store.LeaseRetry)
	e.clock.Advance(lease)
	live := e.create("s", "live", "fp", store.LeaseUnknown)
	got, err := e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("sweep with Limit 3 returned %d", len(got))
	}
	more, err := e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(more) != 2 {
		t.Fatalf("second sweep returned %d, want 2", len(more))
	}
	for _, z := range zombies {
		r := e.get(z.Scope, z.Key)
		if r.State != store.StateUnknown || r.LastError != "lease_expired" {
			t.Fatalf("swept %s: %s %q", z.Key, r.State, r.LastError)
		}
		wantTime(t, "ReconcileAfter", r.ReconcileAfter, e.clock.Now())
	}
	for _, r := range append(got, more...) {
		if r.State != store.StateUnknown {
			t.Fatalf("sweep returned a record in state %s", r.State)
		}
	}
	e.mustUnchanged(retry, "the sweep (policy retry)")
	e.mustUnchanged(live, "the sweep (live lease)")
	if again, err := e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 100}); err != nil || len(again) != 0 {
		t.Fatalf("third sweep: %d records, %v", len(again), err)
	}
}

func testSweepRace(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const n = 40
	for i := 0; i < n; i++ {
		e.create("s", fmt.Sprint("z", i), "fp", store.LeaseUnknown)
	}
	e.clock.Advance(lease)
	handles := []store.Store{e.s, e.s}
	if h.Shared {
		handles[1] = e.open(t, e.clock.Now)
	}
	var total atomic.Int64
	seen := sync.Map{}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				recs, err := handles[w%2].SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 4})
				if err != nil {
					errc <- err
					return
				}
				if len(recs) == 0 {
					return
				}
				for _, r := range recs {
					if _, dup := seen.LoadOrStore(r.Key, true); dup {
						errc <- fmt.Errorf("record %s swept twice", r.Key)
						return
					}
				}
				total.Add(int64(len(recs)))
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if total.Load() != n {
		t.Fatalf("racing sweepers reset %d records, want %d", total.Load(), n)
	}
}

func testReconcile(t *testing.T, h Harness) {
	e := newEnv(t, h)
	for i := 0; i < 3; i++ {
		r := e.create("s", fmt.Sprint("u", i), "fp", store.LeaseUnknown)
		if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "timeout"}); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Second)
	}
	e.create("s", "busy", "fp", store.LeaseUnknown)
	list, err := e.s.ListUnknown(e.ctx, store.ListUnknownParams{DueOnly: true, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0].Key != "u0" || list[2].Key != "u2" {
		t.Fatalf("ListUnknown: %d records %v", len(list), keys(list))
	}
	// Defer u0: it is no longer due, and its attempts grow.
	if err := e.s.Defer(e.ctx, deferOf(list[0], time.Minute, "provider 500")); err != nil {
		t.Fatal(err)
	}
	d := e.get("s", "u0")
	if d.ReconcileAttempts != 1 || d.LastError != "provider 500" || d.State != store.StateUnknown {
		t.Fatalf("deferred: %+v", d)
	}
	wantTime(t, "ReconcileAfter after Defer", d.ReconcileAfter, e.clock.Now().Add(time.Minute))
	list, _ = e.s.ListUnknown(e.ctx, store.ListUnknownParams{DueOnly: true, Limit: 10})
	if len(list) != 2 || list[0].Key != "u1" {
		t.Fatalf("due after Defer: %v", keys(list))
	}
	all, _ := e.s.ListUnknown(e.ctx, store.ListUnknownParams{Limit: 10})
	if len(all) != 3 {
		t.Fatalf("all unknown: %v", keys(all))
	}
	if l, _ := e.s.ListUnknown(e.ctx, store.ListUnknownParams{Limit: 1}); len(l) != 1 {
		t.Fatalf("ListUnknown Limit 1 returned %d", len(l))
	}
	// Resolve to completed: the retry replays the resolved response.
	resp := sampleResponse()
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: e.fenceNow("s", "u1"), To: store.StateCompleted, Response: &resp}); err != nil {
		t.Fatal(err)
	}
	res := e.reserve(e.s, e.reserveP("s", "u1", "fp", store.LeaseUnknown))
	if res.Outcome != store.Existing || res.Record.State != store.StateCompleted || !sameResponse(res.Record.Response, &resp) {
		t.Fatalf("after Resolve completed: %v %+v", res.Outcome, res.Record)
	}
	if res.Record.CompletedAt.IsZero() || res.Record.LastError != "" {
		t.Fatalf("resolved record: CompletedAt %v, LastError %q", res.Record.CompletedAt, res.Record.LastError)
	}
	// Resolve to retryable: the retry executes again.
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: e.fenceNow("s", "u2"), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	res = e.reserve(e.s, e.reserveP("s", "u2", "fp", store.LeaseUnknown))
	if res.Outcome != store.Reclaimed || res.Record.Fence != e.clock.Now().UnixMicro() {
		t.Fatalf("after Resolve retryable: %v fence %d", res.Outcome, res.Record.Fence)
	}
	// Only unknown records resolve.
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: e.fenceNow("s", "busy"), To: store.StateFailedRetryable}); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("Resolve of an in_progress record: %v, want ErrStateConflict", err)
	}
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: "s", Key: "nope", Fence: 1}, To: store.StateFailedRetryable}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Resolve of a missing record: %v, want ErrNotFound", err)
	}
	if err := e.s.Defer(e.ctx, deferOf(e.get("s", "busy"), time.Minute, "")); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("Defer of an in_progress record: %v, want ErrStateConflict", err)
	}
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: e.fenceNow("s", "u0"), To: store.StateCompleted}); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("Resolve to completed without a response: %v, want ErrInvalidParams", err)
	}
}

// testResolveFence: a settlement is about one execution. Once the record
// ran again (released, reclaimed with a new fence, unknown again), a
// settlement naming the older fence changes nothing, whatever it says.
func testResolveFence(t *testing.T, h Harness) {
	e := newEnv(t, h)
	first := e.create("s", "k", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(first), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	ahead := fenceOf(first)
	ahead.Fence++
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: ahead, To: store.StateFailedRetryable}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Resolve naming a fence the record never had: %v, want ErrLeaseLost", err)
	}
	if got := e.get("s", "k"); got.State != store.StateUnknown {
		t.Fatalf("a refused Resolve moved the record to %s", got.State)
	}
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(first), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	second := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown))
	if second.Outcome != store.Reclaimed || second.Record.Fence <= first.Fence {
		t.Fatalf("retry after the release: %v fence %d (first %d)", second.Outcome, second.Record.Fence, first.Fence)
	}
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(second.Record), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	before := e.get("s", "k")
	resp := sampleResponse()
	for name, p := range map[string]store.ResolveParams{
		"released again": {FenceParams: fenceOf(first), To: store.StateFailedRetryable},
		"completed":      {FenceParams: fenceOf(first), To: store.StateCompleted, Response: &resp},
	} {
		if err := e.s.Resolve(e.ctx, p); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Resolve (%s) about the first execution of a record that ran again: %v, want ErrLeaseLost", name, err)
		}
		if diff := diffRecords(before, e.get("s", "k")); diff != nil {
			t.Fatalf("Resolve (%s) about the first execution changed the record: %v", name, diff)
		}
	}
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(second.Record), To: store.StateCompleted, Response: &resp}); err != nil {
		t.Fatalf("Resolve about the current execution: %v", err)
	}
	// Once settled: the same fence is a state conflict, an older one still
	// lost.
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(second.Record), To: store.StateFailedRetryable}); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("Resolve of a settled record: %v, want ErrStateConflict", err)
	}
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(first), To: store.StateFailedRetryable}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Resolve of a settled record about an older execution: %v, want ErrLeaseLost", err)
	}
}

// testResolveLapsed: a record whose lease lapsed goes unknown under the
// fence of the execution that held it (swept, or met by a duplicate's
// Reserve), and that execution, whose Complete is now refused, can settle
// it with Resolve as a reconciler would (the engine does when its outcome
// reaches the store late). A record taken over under policy retry (a new
// fence) or deleted refuses that settlement and is left as it is.
func testResolveLapsed(t *testing.T, h Harness) {
	e := newEnv(t, h)
	swept := e.create("s", "swept", "fp", store.LeaseUnknown)
	met := e.create("s", "met", "fp", store.LeaseUnknown)
	taken := e.create("s", "taken", "fp", store.LeaseRetry)
	deleted := e.create("s", "deleted", "fp", store.LeaseUnknown)
	e.clock.Advance(lease + time.Second)
	// A duplicate's Reserve moves an expired lease to unknown as the
	// sweeper would.
	if res := e.reserve(e.s, e.reserveP("s", "met", "fp", store.LeaseUnknown)); res.Outcome != store.Existing || res.Record.State != store.StateUnknown {
		t.Fatalf("duplicate of an expired lease: %v %s, want existing unknown", res.Outcome, res.Record.State)
	}
	if got, err := e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 10}); err != nil || len(got) != 2 {
		t.Fatalf("sweep: %v, %d records (want swept and deleted)", err, len(got))
	}
	for _, r := range []store.Record{swept, met, deleted} {
		if got := e.get(r.Scope, r.Key); got.State != store.StateUnknown || got.Fence != r.Fence {
			t.Fatalf("%s after the sweep: %s fence %d, want unknown under fence %d", r.Key, got.State, got.Fence, r.Fence)
		}
	}
	// The holder's late Complete is refused; its settlement is not.
	resp := sampleResponse()
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(swept), Response: resp, TTL: ttl}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete of a swept record: %v, want ErrLeaseLost", err)
	}
	e.clock.Advance(time.Second)
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(swept), To: store.StateCompleted, Response: &resp, TTL: ttl}); err != nil {
		t.Fatalf("Resolve of a swept record under its fence: %v", err)
	}
	got := e.get("s", "swept")
	if got.State != store.StateCompleted || got.Fence != swept.Fence || !sameResponse(got.Response, &resp) || got.LastError != "" {
		t.Fatalf("settled record: %s fence %d response %+v last error %q", got.State, got.Fence, got.Response, got.LastError)
	}
	wantTime(t, "ExpiresAt of the settled record", got.ExpiresAt, e.clock.Now().Add(ttl))
	res := e.reserve(e.s, e.reserveP("s", "swept", "fp", store.LeaseUnknown))
	if res.Outcome != store.Existing || res.Record.State != store.StateCompleted || !sameResponse(res.Record.Response, &resp) {
		t.Fatalf("retry of the settled record: %v %s", res.Outcome, res.Record.State)
	}

	// A release settles the record a duplicate met as failed_retryable,
	// its expiry kept.
	e.clock.Advance(time.Second)
	met = e.get("s", "met")
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(met), To: store.StateFailedRetryable}); err != nil {
		t.Fatalf("Resolve to failed_retryable under its fence: %v", err)
	}
	if got := e.get("s", "met"); got.State != store.StateFailedRetryable || got.Fence != met.Fence || !got.ExpiresAt.Equal(met.ExpiresAt) {
		t.Fatalf("released record: %s fence %d expires %v (was %v)", got.State, got.Fence, got.ExpiresAt, met.ExpiresAt)
	}

	// Taken over under policy retry: the record runs again under a new
	// fence, and the first holder's settlement changes nothing.
	res = e.reserve(e.s, e.reserveP("s", "taken", "fp", store.LeaseRetry))
	if res.Outcome != store.TakenOver || res.Record.Fence <= taken.Fence {
		t.Fatalf("takeover: %v fence %d (was %d)", res.Outcome, res.Record.Fence, taken.Fence)
	}
	for _, to := range []store.State{store.StateCompleted, store.StateFailedRetryable} {
		p := store.ResolveParams{FenceParams: fenceOf(taken), To: to}
		if to == store.StateCompleted {
			p.Response, p.TTL = &resp, ttl
		}
		if err := e.s.Resolve(e.ctx, p); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Resolve (%s) about the holder before a takeover: %v, want ErrLeaseLost", to, err)
		}
		e.mustUnchanged(res.Record, "Resolve about the holder before a takeover")
	}

	// Deleted by an operator: nothing is recreated.
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: "s", Key: "deleted"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(deleted), To: store.StateCompleted, Response: &resp, TTL: ttl}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Resolve of a deleted record: %v, want ErrNotFound", err)
	}
	if _, err := e.s.Get(e.ctx, "s", "deleted"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after Resolve of a deleted record: %v, want ErrNotFound", err)
	}
}

func keys(rs []store.Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Key
	}
	return out
}

func testGetDelete(t *testing.T, h Harness) {
	e := newEnv(t, h)
	if _, err := e.s.Get(e.ctx, "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of a missing record: %v", err)
	}
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: "s", Key: "k"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Delete of a missing record: %v", err)
	}
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	// In progress: its holder may be alive, so it is not deleted.
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: "s", Key: "k"}); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("Delete of an in-progress record: %v, want ErrStateConflict", err)
	}
	e.mustUnchanged(r, "a refused Delete")
	e.complete(r, sampleResponse())
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Get(e.ctx, "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	if res := e.reserve(e.s, e.reserveP("s", "k", "fp2", store.LeaseUnknown)); res.Outcome != store.Created {
		t.Fatalf("Reserve after Delete: %v", res.Outcome)
	}
}

// testDeleteFence: a delete that names the fence its operator was shown
// removes the record only while it holds that execution. One that ran
// again since (settled, retried and answered under a new fence) keeps its
// answer: deleting it would let the next retry run the request again.
func testDeleteFence(t *testing.T, h Harness) {
	e := newEnv(t, h)
	del := func(key string, fence int64) error {
		return e.s.Delete(e.ctx, store.DeleteParams{Scope: "s", Key: key, Fence: fence})
	}
	gone := func(key, what string) {
		t.Helper()
		if _, err := e.s.Get(e.ctx, "s", key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after %s: %v, want ErrNotFound", what, err)
		}
	}

	// The fence the record holds: deleted.
	r := e.create("s", "current", "fp", store.LeaseUnknown)
	e.complete(r, sampleResponse())
	if err := del("current", r.Fence); err != nil {
		t.Fatalf("Delete with the record's fence: %v", err)
	}
	gone("current", "a Delete with the record's fence")
	if err := del("current", r.Fence); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fenced Delete of a missing record: %v, want ErrNotFound", err)
	}

	// Shown unknown at one fence, then settled, retried and run again
	// under a new fence: a Delete about the execution shown changes
	// nothing, while the new one runs and once it answered.
	first := e.create("s", "rerun", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(first), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	shown := e.get("s", "rerun")
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(shown), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	again := e.reserve(e.s, e.reserveP("s", "rerun", "fp", store.LeaseUnknown))
	if again.Outcome != store.Reclaimed || again.Record.Fence <= shown.Fence {
		t.Fatalf("reclaim: %v fence %d (was %d)", again.Outcome, again.Record.Fence, shown.Fence)
	}
	if err := del("rerun", shown.Fence); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Delete about an older execution, the new one in progress: %v, want ErrLeaseLost", err)
	}
	e.mustUnchanged(again.Record, "a Delete about an older execution")
	e.complete(again.Record, sampleResponse())
	answered := e.get("s", "rerun")
	if err := del("rerun", shown.Fence); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Delete about an older execution, the new one answered: %v, want ErrLeaseLost", err)
	}
	e.mustUnchanged(answered, "a Delete about an older execution")

	// Fence 0: whatever execution the record holds.
	if err := del("rerun", 0); err != nil {
		t.Fatalf("Delete without a fence: %v", err)
	}
	gone("rerun", "a Delete without a fence")

	// In progress under the fence named: refused for its state.
	held := e.create("s", "held", "fp", store.LeaseUnknown)
	if err := del("held", held.Fence); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("fenced Delete of an in-progress record: %v, want ErrStateConflict", err)
	}
	e.mustUnchanged(held, "a fenced Delete of an in-progress record")
}

func testDurable(t *testing.T, h Harness) {
	if !h.Durable {
		t.Skip("storetest: this store keeps nothing across a reopen (not Durable)")
	}
	t.Parallel()
	open := h.NewDatabase(t)
	c := NewClock()
	s := open(t, c.Now)
	ctx := context.Background()
	res, err := s.Reserve(ctx, store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: ttl, LeasePolicy: store.LeaseUnknown})
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("Reserve: %v %v", res.Outcome, err)
	}
	resp := sampleResponse()
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fenceOf(res.Record), Response: resp}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2 := open(t, c.Now)
	res, err = s2.Reserve(ctx, store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: ttl, LeasePolicy: store.LeaseUnknown})
	if err != nil || res.Outcome != store.Existing || !sameResponse(res.Record.Response, &resp) {
		t.Fatalf("after reopen: %v %+v %v", res.Outcome, res.Record, err)
	}
}

func testInvalid(t *testing.T, h Harness) {
	e := newEnv(t, h)
	bad := []store.ReserveParams{
		{Scope: "", Key: "k", Fingerprint: "fp", Lease: lease, TTL: ttl, LeasePolicy: store.LeaseUnknown},
		{Scope: "s", Key: "", Fingerprint: "fp", Lease: lease, TTL: ttl, LeasePolicy: store.LeaseUnknown},
		{Scope: "s", Key: "k", Fingerprint: "", Lease: lease, TTL: ttl, LeasePolicy: store.LeaseUnknown},
		{Scope: "s", Key: "k", Fingerprint: "fp", Lease: 0, TTL: ttl, LeasePolicy: store.LeaseUnknown},
		{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: ttl, LeasePolicy: "sometimes"},
	}
	for i, p := range bad {
		if _, err := e.s.Reserve(e.ctx, p); !errors.Is(err, store.ErrInvalidParams) {
			t.Fatalf("case %d: Reserve(%+v) = %v, want ErrInvalidParams", i, p, err)
		}
	}
	if _, err := e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 0}); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("Sweep with Limit 0: %v", err)
	}
	if _, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 0, Abandoned: abandoned, AbandonedTTL: time.Hour}); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("Reap with Limit 0: %v", err)
	}
	if _, err := e.s.ListUnknown(e.ctx, store.ListUnknownParams{Limit: 0}); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("ListUnknown with Limit 0: %v", err)
	}
}

func testStoreClock(t *testing.T, h Harness) {
	t.Parallel()
	s := h.NewDatabase(t)(t, nil)
	before := time.Now()
	res, err := s.Reserve(context.Background(), store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: ttl, LeasePolicy: store.LeaseUnknown})
	if err != nil {
		t.Fatal(err)
	}
	// The store's own clock (a database server's) may differ from ours by a
	// little; it must not be another epoch or time zone.
	if d := res.Record.CreatedAt.Sub(before); d < -time.Minute || d > time.Minute {
		t.Fatalf("store clock: CreatedAt %v is %v away from now", res.Record.CreatedAt, d)
	}
	if d := res.Record.LockedUntil.Sub(res.Record.CreatedAt); d != lease {
		t.Fatalf("store clock: lease of %v, want %v", d, lease)
	}
	if loc := res.Record.CreatedAt.Location(); loc != time.UTC {
		t.Fatalf("store clock: times in %v, want UTC", loc)
	}
}

func testCancelled(t *testing.T, h Harness) {
	e := newEnv(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.s.Reserve(ctx, e.reserveP("s", "k", "fp", store.LeaseUnknown)); err == nil {
		t.Fatal("Reserve with a cancelled context succeeded")
	}
	if _, err := e.s.Get(ctx, "s", "k"); err == nil || errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get with a cancelled context: %v, want the context error", err)
	}
}

// testFenceAcrossDelete: a holder cut off long enough, whose record was
// completed by another holder, deleted and created again, must not be able
// to touch the new record with its old fence.
func testFenceAcrossDelete(t *testing.T, h Harness) {
	e := newEnv(t, h)
	first := e.create("s", "k", "fp", store.LeaseRetry)
	e.clock.Advance(lease)
	taken := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseRetry))
	if taken.Outcome != store.TakenOver || taken.Record.Fence <= first.Fence {
		t.Fatalf("takeover: %v fence %d after %d", taken.Outcome, taken.Record.Fence, first.Fence)
	}
	e.complete(taken.Record, sampleResponse())
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Millisecond)
	again := e.create("s", "k", "fp", store.LeaseRetry)
	for _, old := range []store.Record{first, taken.Record} {
		if again.Fence <= old.Fence {
			t.Fatalf("record created after a delete has fence %d, not above the old %d", again.Fence, old.Fence)
		}
		if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(old), Response: sampleResponse()}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Complete with the fence %d of the deleted record: %v, want ErrLeaseLost", old.Fence, err)
		}
		if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(old), Lease: lease}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Extend with the fence %d of the deleted record: %v, want ErrLeaseLost", old.Fence, err)
		}
	}
	e.mustUnchanged(again, "the holders of the deleted record")
}

// testFenceClockBack: while a row exists, its fence grows whatever the
// clock does.
func testFenceClockBack(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "reclaim", "fp", store.LeaseUnknown)
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "x"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(-time.Hour)
	res := e.reserve(e.s, e.reserveP("s", "reclaim", "fp", store.LeaseUnknown))
	if res.Outcome != store.Reclaimed || res.Record.Fence != r.Fence+1 {
		t.Fatalf("reclaim with the clock set back: %v fence %d, want %d", res.Outcome, res.Record.Fence, r.Fence+1)
	}
	if err := e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fenceOf(r), Response: sampleResponse()}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete with the fence before the reclaim: %v, want ErrLeaseLost", err)
	}

	// A soft-expired row is recreated above its fence, the clock set back.
	done := e.create("s", "expired", "fp", store.LeaseUnknown)
	e.complete(done, sampleResponse())
	e.clock.Advance(ttl)
	if res, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 10, Soft: true, Abandoned: abandoned, AbandonedTTL: time.Hour}); err != nil || res.Deleted < 1 {
		t.Fatalf("soft Reap: %+v %v", res, err)
	}
	e.clock.Advance(-2 * ttl)
	res = e.reserve(e.s, e.reserveP("s", "expired", "fp", store.LeaseUnknown))
	if res.Outcome != store.Created || res.Record.Fence != done.Fence+1 {
		t.Fatalf("recreation with the clock set back: %v fence %d, want %d", res.Outcome, res.Record.Fence, done.Fence+1)
	}
}

// identityOps runs every operation that names a record on (scope, key) and
// returns their errors by name.
func (e *env) identityOps(scope, key string) map[string]error {
	resp := sampleResponse()
	fp := store.FenceParams{Scope: scope, Key: key, Fence: 1}
	_, reserveErr := e.s.Reserve(e.ctx, e.reserveP(scope, key, "fp", store.LeaseUnknown))
	_, getErr := e.s.Get(e.ctx, scope, key)
	return map[string]error{
		"Reserve":     reserveErr,
		"Get":         getErr,
		"Delete":      e.s.Delete(e.ctx, store.DeleteParams{Scope: scope, Key: key}),
		"Complete":    e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fp, Response: resp}),
		"Release":     e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fp}),
		"MarkUnknown": e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fp}),
		"Checkpoint":  e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: fp, RecoveryPoint: "p"}),
		"Extend":      e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fp, Lease: lease}),
		"Resolve":     e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fp, To: store.StateFailedRetryable}),
		"Defer":       e.s.Defer(e.ctx, store.DeferParams{FenceParams: fp, Delay: time.Minute}),
	}
}

// testIdentityLimits: every store takes a scope and a key up to the
// contract's limits, in multi-byte UTF-8, and refuses one byte more, invalid
// UTF-8 and NUL with the contract's errors before touching its database.
func testIdentityLimits(t *testing.T, h Harness) {
	e := newEnv(t, h)
	// 4-byte characters: the most bytes a schema must hold per character.
	scope := strings.Repeat("𝄞", store.MaxScopeBytes/4)
	key := strings.Repeat("🔑", store.MaxKeyBytes/4)
	if len(scope) != store.MaxScopeBytes || len(key) != store.MaxKeyBytes {
		t.Fatalf("test identity of %d and %d bytes", len(scope), len(key))
	}
	p := e.reserveP(scope, key, strings.Repeat("f", store.MaxFingerprintBytes), store.LeaseUnknown)
	r := e.reserve(e.s, p)
	if r.Outcome != store.Created || r.Record.Scope != scope || r.Record.Key != key {
		t.Fatalf("Reserve at the limits: %v, scope and key kept: %v", r.Outcome, r.Record.Scope == scope && r.Record.Key == key)
	}
	e.complete(r.Record, sampleResponse())
	if got := e.get(scope, key); got.State != store.StateCompleted || got.Fingerprint != p.Fingerprint {
		t.Fatalf("record at the limits: %s", got.State)
	}
	if err := e.s.Delete(e.ctx, store.DeleteParams{Scope: scope, Key: key}); err != nil {
		t.Fatalf("Delete at the limits: %v", err)
	}

	over := p
	over.Fingerprint = strings.Repeat("f", store.MaxFingerprintBytes+1)
	if _, err := e.s.Reserve(e.ctx, over); !errors.Is(err, store.ErrTooLong) {
		t.Fatalf("Reserve with a fingerprint one byte too long: %v, want ErrTooLong", err)
	}
	for _, c := range []struct {
		name, scope, key string
		want             error
	}{
		{"scope one byte too long", scope + "s", "k", store.ErrTooLong},
		{"key one byte too long", "s", key + "k", store.ErrTooLong},
		{"scope not UTF-8", "s\xff", "k", store.ErrInvalidParams},
		{"key not UTF-8", "s", "k\xc3", store.ErrInvalidParams},
		{"scope with NUL", "s\x00", "k", store.ErrInvalidParams},
		{"key with NUL", "s", "\x00k", store.ErrInvalidParams},
		{"empty scope", "", "k", store.ErrInvalidParams},
		{"empty key", "s", "", store.ErrInvalidParams},
	} {
		for op, err := range e.identityOps(c.scope, c.key) {
			if !errors.Is(err, c.want) {
				t.Errorf("%s with %s: %v, want %v", op, c.name, err, c.want)
			}
			if c.want != store.ErrTooLong && errors.Is(err, store.ErrTooLong) {
				t.Errorf("%s with %s: %v, not a length error", op, c.name, err)
			}
			if store.IsRetryable(err) {
				t.Errorf("%s with %s: %v is retryable", op, c.name, err)
			}
		}
	}
	if list, err := e.s.ListUnknown(e.ctx, store.ListUnknownParams{Limit: 10}); err != nil || len(list) != 0 {
		t.Fatalf("refused operations left records behind: %v %v", keys(list), err)
	}
}

// testInvalidEveryOp: each operation refuses the parameters its Validate
// refuses, changing nothing.
func testInvalidEveryOp(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	fp := fenceOf(r)
	zero := fp
	zero.Fence = 0
	bad := store.Response{Status: 42}
	ops := map[string]error{
		"Complete fence 0":         e.s.Complete(e.ctx, store.CompleteParams{FenceParams: zero, Response: sampleResponse()}),
		"Complete negative ttl":    e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fp, Response: sampleResponse(), TTL: -time.Second}),
		"Complete status 42":       e.s.Complete(e.ctx, store.CompleteParams{FenceParams: fp, Response: bad}),
		"Release fence 0":          e.s.Release(e.ctx, store.ReleaseParams{FenceParams: zero}),
		"MarkUnknown fence 0":      e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: zero}),
		"Checkpoint fence 0":       e.s.Checkpoint(e.ctx, store.CheckpointParams{FenceParams: zero}),
		"Extend zero lease":        e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fp}),
		"Resolve fence 0":          e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: zero, To: store.StateFailedRetryable}),
		"Resolve negative ttl":     e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fp, To: store.StateFailedRetryable, TTL: -1}),
		"Resolve status 42":        e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fp, To: store.StateCompleted, Response: &bad}),
		"Resolve to in_progress":   e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fp, To: store.StateInProgress}),
		"Defer fence 0":            e.s.Defer(e.ctx, store.DeferParams{FenceParams: zero, Delay: time.Second}),
		"Defer negative attempts":  e.s.Defer(e.ctx, store.DeferParams{FenceParams: fp, Attempts: -1, Delay: time.Second}),
		"Defer negative delay":     e.s.Defer(e.ctx, store.DeferParams{FenceParams: fp, Delay: -time.Second}),
		"Delete negative fence":    e.s.Delete(e.ctx, store.DeleteParams{Scope: fp.Scope, Key: fp.Key, Fence: -1}),
		"Reap status 42":           second(e.s.Reap(e.ctx, store.ReapParams{Limit: 1, Abandoned: bad})),
		"Reap negative ttl":        second(e.s.Reap(e.ctx, store.ReapParams{Limit: 1, Abandoned: abandoned, AbandonedTTL: -1})),
		"Reap negative grace":      second(e.s.Reap(e.ctx, store.ReapParams{Limit: 1, Abandoned: abandoned, Grace: -time.Second})),
		"Sweep negative grace":     second(e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 1, Grace: -time.Second})),
		"ListUnknown negative":     second(e.s.ListUnknown(e.ctx, store.ListUnknownParams{Limit: -1})),
		"Reserve negative ttl":     second(e.s.Reserve(e.ctx, store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: -1, LeasePolicy: store.LeaseUnknown})),
		"Reserve without a policy": second(e.s.Reserve(e.ctx, store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: ttl})),
	}
	for name, err := range ops {
		if !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("%s: %v, want ErrInvalidParams", name, err)
		}
	}
	e.mustUnchanged(r, "refused operations")
}

func second[T any](_ T, err error) error { return err }

// testRounding: every store rounds the durations it is given up to whole
// microseconds (storekit.Micros), so a lease is never cut short and one
// duration means one instant on every store.
func testRounding(t *testing.T, h Harness) {
	e := newEnv(t, h)
	now := e.clock.Now()
	p := e.reserveP("s", "k", "fp", store.LeaseUnknown)
	p.Lease = lease + time.Nanosecond
	p.TTL = ttl + 999*time.Nanosecond
	r := e.reserve(e.s, p)
	wantTime(t, "LockedUntil of a lease with 1ns more", r.Record.LockedUntil, now.Add(lease+time.Microsecond))
	wantTime(t, "ExpiresAt of a ttl with 999ns more", r.Record.ExpiresAt, now.Add(ttl+time.Microsecond))
	if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(r.Record), Lease: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	wantTime(t, "LockedUntil after a 1ns Extend", e.get("s", "k").LockedUntil, now.Add(time.Microsecond))
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r.Record)}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Defer(e.ctx, deferOf(e.get("s", "k"), time.Second+time.Nanosecond, "")); err != nil {
		t.Fatal(err)
	}
	wantTime(t, "ReconcileAfter after a Defer of 1s+1ns", e.get("s", "k").ReconcileAfter, now.Add(time.Second+time.Microsecond))
	if got := storekit.RoundUp(time.Second + time.Nanosecond); got != time.Second+time.Microsecond {
		t.Fatalf("storekit.RoundUp(1s+1ns) = %v", got)
	}
}

// testSweepGrace: a lease that ended less than Grace ago is not swept; the
// sweep takes it once Grace has passed.
func testSweepGrace(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	const grace = 10 * time.Second
	sweep := func() []store.Record {
		t.Helper()
		got, err := e.s.SweepExpiredLeases(e.ctx, store.SweepParams{Limit: 10, Grace: grace})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	e.clock.Advance(lease)
	if got := sweep(); len(got) != 0 {
		t.Fatalf("sweep with grace at the end of the lease: %v", keys(got))
	}
	e.clock.Advance(grace - time.Microsecond)
	if got := sweep(); len(got) != 0 {
		t.Fatalf("sweep with grace 1µs before it passed: %v", keys(got))
	}
	e.mustUnchanged(r, "sweeps inside the grace")
	// The holder is alive again: a renewal inside the grace keeps the record.
	if err := e.s.Extend(e.ctx, store.ExtendParams{FenceParams: fenceOf(r), Lease: lease}); err != nil {
		t.Fatalf("renewal inside the grace: %v", err)
	}
	e.clock.Advance(lease + grace)
	if got := sweep(); len(got) != 1 || got[0].State != store.StateUnknown {
		t.Fatalf("sweep once the grace passed: %v", keys(got))
	}
}

// testReconcileAttemptsPerExecution: ReconcileAttempts counts the attempts
// to reconcile one execution's unknown outcome. A new execution of the key
// (a reclaim once the record was settled failed_retryable) starts from 0,
// or a reconciler would dead-letter it early.
func testReconcileAttemptsPerExecution(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "k", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := e.s.Defer(e.ctx, deferOf(e.get("s", "k"), time.Minute, "not yet")); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.get("s", "k"); got.ReconcileAttempts != 2 {
		t.Fatalf("after two deferrals: %d attempts", got.ReconcileAttempts)
	}
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: e.fenceNow("s", "k"), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown))
	if res.Outcome != store.Reclaimed || res.Record.ReconcileAttempts != 0 {
		t.Fatalf("reclaimed: %v with %d attempts, want 0", res.Outcome, res.Record.ReconcileAttempts)
	}
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(res.Record), Error: "timeout again"}); err != nil {
		t.Fatal(err)
	}
	if got := e.get("s", "k"); got.State != store.StateUnknown || got.ReconcileAttempts != 0 {
		t.Fatalf("the new execution's unknown outcome: %s with %d attempts, want 0", got.State, got.ReconcileAttempts)
	}
}

// testDeadLetter: a dead-lettered unknown record stays unknown, is never
// due again, is still listed for operators and still resolves.
func testDeadLetter(t *testing.T, h Harness) {
	e := newEnv(t, h)
	r := e.create("s", "dead", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	live := e.create("s", "live", "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(live), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	before := e.get("s", "dead")
	if before.DeadLettered() {
		t.Fatalf("a new unknown record is dead-lettered: %v", before.DeadLetteredAt)
	}
	if err := e.s.Defer(e.ctx, deadLetterOf(before, "gave up after 20 attempts")); err != nil {
		t.Fatal(err)
	}
	d := e.get("s", "dead")
	if d.State != store.StateUnknown || d.ReconcileAttempts != 1 || d.LastError != "gave up after 20 attempts" || !d.DeadLettered() {
		t.Fatalf("dead-lettered: %+v", d)
	}
	wantTime(t, "DeadLetteredAt", d.DeadLetteredAt, e.clock.Now())
	// A later Defer without DeadLetter (a reconciler's late attempt, shown
	// the record as it is now) leaves it dead-lettered: listed for
	// operators, never due.
	if err := e.s.Defer(e.ctx, deferOf(d, time.Minute, "late attempt")); err != nil {
		t.Fatal(err)
	}
	if d := e.get("s", "dead"); !d.DeadLettered() || d.State != store.StateUnknown {
		t.Fatalf("deferred after its dead letter: %s, DeadLetteredAt %v", d.State, d.DeadLetteredAt)
	}
	e.clock.Advance(100 * 365 * 24 * time.Hour)
	due, err := e.s.ListUnknown(e.ctx, store.ListUnknownParams{DueOnly: true, Limit: 10})
	if err != nil || len(due) != 1 || due[0].Key != "live" {
		t.Fatalf("due a century later: %v %v, want only live", keys(due), err)
	}
	all, err := e.s.ListUnknown(e.ctx, store.ListUnknownParams{Limit: 10})
	if err != nil || len(all) != 2 {
		t.Fatalf("every unknown record: %v %v, want both", keys(all), err)
	}
	for _, rec := range all {
		if (rec.Key == "dead") != rec.DeadLettered() {
			t.Fatalf("listed %s with DeadLetteredAt %v", rec.Key, rec.DeadLetteredAt)
		}
	}
	// A retry of a dead-lettered record is refused like any unknown one.
	if res := e.reserve(e.s, e.reserveP("s", "dead", "fp", store.LeaseUnknown)); res.Outcome != store.Existing || res.Record.State != store.StateUnknown {
		t.Fatalf("retry of a dead-lettered record: %v %s", res.Outcome, res.Record.State)
	}
	resp := sampleResponse()
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: e.fenceNow("s", "dead"), To: store.StateCompleted, Response: &resp}); err != nil {
		t.Fatalf("Resolve of a dead-lettered record: %v", err)
	}
	if got := e.get("s", "dead"); got.State != store.StateCompleted || got.DeadLettered() {
		t.Fatalf("resolved: %s, DeadLetteredAt %v", got.State, got.DeadLetteredAt)
	}
	if err := e.s.Defer(e.ctx, deadLetterOf(e.get("s", "dead"), "")); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("dead-lettering a completed record: %v, want ErrStateConflict", err)
	}
	if err := e.s.Defer(e.ctx, store.DeferParams{FenceParams: store.FenceParams{Scope: "s", Key: "nope", Fence: 1}, DeadLetter: true}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("dead-lettering a missing record: %v, want ErrNotFound", err)
	}
	// Past its ExpiresAt a dead-lettered record is abandoned like any
	// unknown one, and is no longer dead-lettered.
	if err := e.s.Defer(e.ctx, deadLetterOf(e.get("s", "live"), "")); err != nil {
		t.Fatal(err)
	}
	if res, err := e.s.Reap(e.ctx, store.ReapParams{Limit: 10, Abandoned: abandoned, AbandonedTTL: time.Hour}); err != nil || res.Abandoned != 1 {
		t.Fatalf("Reap of a dead-lettered record past expiry: %+v %v", res, err)
	}
	if got := e.get("s", "live"); got.State != store.StateCompleted || got.DeadLettered() || got.LastError != "abandoned" {
		t.Fatalf("abandoned dead-lettered record: %s, DeadLetteredAt %v, LastError %q", got.State, got.DeadLetteredAt, got.LastError)
	}
}

// testListUnknownOrder: ListUnknown lists by ReconcileAfter, oldest
// first, dead-lettered records among the others at theirs (the operator's
// listing without DueOnly), and its Limit keeps the oldest.
func testListUnknownOrder(t *testing.T, h Harness) {
	e := newEnv(t, h)
	for _, k := range []string{"u0", "u1", "u2", "u3"} {
		e.unknownRecord(k)
		e.clock.Advance(time.Second)
	}
	for _, k := range []string{"u0", "u2"} {
		if err := e.s.Defer(e.ctx, deadLetterOf(e.get("s", k), "gave up")); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.s.Defer(e.ctx, deferOf(e.get("s", "u1"), time.Minute, "provider 500")); err != nil {
		t.Fatal(err)
	}
	list := func(p store.ListUnknownParams, want string) {
		t.Helper()
		got, err := e.s.ListUnknown(e.ctx, p)
		if err != nil || fmt.Sprint(keys(got)) != want {
			t.Fatalf("ListUnknown(%+v) = %v %v, want %s", p, keys(got), err, want)
		}
	}
	list(store.ListUnknownParams{Limit: 10}, "[u0 u2 u3 u1]")
	list(store.ListUnknownParams{Limit: 2}, "[u0 u2]")
	list(store.ListUnknownParams{DueOnly: true, Limit: 10}, "[u3]")
	// A deferral of a dead-lettered record moves its ReconcileAfter, and
	// its place in the listing, without making it due.
	if err := e.s.Defer(e.ctx, deferOf(e.get("s", "u0"), 2*time.Minute, "late attempt")); err != nil {
		t.Fatal(err)
	}
	list(store.ListUnknownParams{Limit: 10}, "[u2 u3 u1 u0]")
	e.clock.Advance(time.Hour)
	list(store.ListUnknownParams{DueOnly: true, Limit: 10}, "[u3 u1]")
}

// unknownRecord creates key's record and marks it unknown, as the
// reconciler lists it.
func (e *env) unknownRecord(key string) store.Record {
	e.t.Helper()
	r := e.create("s", key, "fp", store.LeaseUnknown)
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(r), Error: "timeout"}); err != nil {
		e.t.Fatal(err)
	}
	return e.get("s", key)
}

// testDeferFence: a reconciliation attempt is about one execution. Once
// the record ran again (settled failed_retryable, reclaimed with a new
// fence, unknown again), a deferral or a dead letter naming the older
// fence changes nothing, whatever the record's state.
func testDeferFence(t *testing.T, h Harness) {
	e := newEnv(t, h)
	listed := e.unknownRecord("k")
	// Meanwhile a webhook settles it, a retry runs it again and that
	// execution's outcome is unknown too.
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(listed), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	res := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown))
	if res.Outcome != store.Reclaimed || res.Record.Fence == listed.Fence {
		t.Fatalf("retry: %v fence %d, want reclaimed under a new fence", res.Outcome, res.Record.Fence)
	}
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(res.Record), Error: "timeout again"}); err != nil {
		t.Fatal(err)
	}
	again := e.get("s", "k")
	e.refusesDeferrals(listed, store.ErrLeaseLost, again, "of the older execution")
	// The fence is checked whatever the state: the record in progress
	// under a newer fence.
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(again), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	running := e.reserve(e.s, e.reserveP("s", "k", "fp", store.LeaseUnknown)).Record
	if err := e.s.Defer(e.ctx, deadLetterOf(again, "gave up")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("dead letter of an older execution while a newer one runs: %v, want ErrLeaseLost", err)
	}
	e.mustUnchanged(running, "a dead letter of an older execution")
	// The current execution's attempts count.
	if err := e.s.MarkUnknown(e.ctx, store.ReleaseParams{FenceParams: fenceOf(running), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Defer(e.ctx, deferOf(e.get("s", "k"), time.Minute, "not yet")); err != nil {
		t.Fatalf("Defer of the current execution: %v", err)
	}
	if got := e.get("s", "k"); got.ReconcileAttempts != 1 || got.LastError != "not yet" {
		t.Fatalf("deferred: %d attempts, LastError %q", got.ReconcileAttempts, got.LastError)
	}
}

// refusesDeferrals checks that both a Defer and a dead letter about the
// record as listed fail with want and leave the record as it is now.
func (e *env) refusesDeferrals(listed store.Record, want error, now store.Record, what string) {
	e.t.Helper()
	for name, p := range map[string]store.DeferParams{
		"Defer":       deferOf(listed, time.Hour, "again"),
		"dead letter": deadLetterOf(listed, "gave up"),
	} {
		if err := e.s.Defer(e.ctx, p); !errors.Is(err, want) {
			e.t.Fatalf("%s %s: %v, want %v", name, what, err, want)
		}
		e.mustUnchanged(now, name+" "+what)
	}
}

// testDeferAttempts: a deferral names the attempts its reconciler was
// shown. Two reconcilers that listed the same record count one attempt:
// the second one's deferral or dead letter changes nothing.
func testDeferAttempts(t *testing.T, h Harness) {
	e := newEnv(t, h)
	listed := e.unknownRecord("k")
	e.clock.Advance(time.Second)
	if err := e.s.Defer(e.ctx, deferOf(listed, time.Minute, "first")); err != nil {
		t.Fatal(err)
	}
	counted := e.get("s", "k")
	if counted.ReconcileAttempts != 1 {
		t.Fatalf("after a deferral: %d attempts, want 1", counted.ReconcileAttempts)
	}
	e.refusesDeferrals(listed, store.ErrStateConflict, counted, "of an attempt already counted")
	// The next attempt, shown the record as it is now, counts.
	e.clock.Advance(time.Minute)
	if err := e.s.Defer(e.ctx, deadLetterOf(counted, "gave up")); err != nil {
		t.Fatalf("dead letter of the next attempt: %v", err)
	}
	dead := e.get("s", "k")
	if dead.ReconcileAttempts != 2 || !dead.DeadLettered() || dead.LastError != "gave up" {
		t.Fatalf("dead-lettered: %d attempts, DeadLetteredAt %v, LastError %q", dead.ReconcileAttempts, dead.DeadLetteredAt, dead.LastError)
	}
	if err := e.s.Defer(e.ctx, deadLetterOf(counted, "gave up again")); !errors.Is(err, store.ErrStateConflict) {
		t.Fatalf("a second dead letter of one attempt: %v, want ErrStateConflict", err)
	}
	e.mustUnchanged(dead, "a second dead letter of one attempt")
}

// testDeferState: only an unknown record is deferred or dead-lettered;
// one in any other state is refused and unchanged: with ErrStateConflict
// when named with its own fence and attempts, with ErrLeaseLost when named
// with another fence (the fence is checked first, whatever the state).
func testDeferState(t *testing.T, h Harness) {
	e := newEnv(t, h)
	e.create("s", "running", "fp", store.LeaseUnknown)
	done := e.create("s", "done", "fp", store.LeaseUnknown)
	e.complete(done, sampleResponse())
	failed := e.create("s", "failed", "fp", store.LeaseUnknown)
	if err := e.s.Release(e.ctx, store.ReleaseParams{FenceParams: fenceOf(failed), Error: "upstream 503"}); err != nil {
		t.Fatal(err)
	}
	settled := e.unknownRecord("settled")
	if err := e.s.Resolve(e.ctx, store.ResolveParams{FenceParams: fenceOf(settled), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	for _, key := range []string{"running", "done", "failed", "settled"} {
		before := e.get("s", key)
		for name, p := range map[string]store.DeferParams{
			"Defer":       deferOf(before, time.Minute, "not yet"),
			"dead letter": deadLetterOf(before, "gave up"),
		} {
			if err := e.s.Defer(e.ctx, p); !errors.Is(err, store.ErrStateConflict) {
				t.Fatalf("%s of the %s record: %v, want ErrStateConflict", name, key, err)
			}
			e.mustUnchanged(before, name+" of the "+key+" record")
			p.Fence--
			if err := e.s.Defer(e.ctx, p); !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("%s of the %s record under another fence: %v, want ErrLeaseLost", name, key, err)
			}
			e.mustUnchanged(before, name+" of the "+key+" record under another fence")
		}
	}
	if err := e.s.Defer(e.ctx, store.DeferParams{FenceParams: store.FenceParams{Scope: "s", Key: "nope", Fence: 1}, Delay: time.Minute}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Defer of a missing record: %v, want ErrNotFound", err)
	}
}

// testConcurrentDefer: reconcilers that listed one record and defer it at
// once, from two handles when the store shares them, count one attempt.
func testConcurrentDefer(t *testing.T, h Harness) {
	e := newEnv(t, h)
	handles := []store.Store{e.s}
	if h.Shared {
		handles = append(handles, e.open(t, e.clock.Now))
	}
	for _, dead := range []bool{false, true} {
		key := fmt.Sprint("dead-", dead)
		listed := e.unknownRecord(key)
		p := deferOf(listed, time.Minute, "not yet")
		p.DeadLetter = dead
		const n = 16
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = handles[i%len(handles)].Defer(e.ctx, p) })
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrStateConflict):
				t.Fatalf("%s: racer %d: %v, want nil or ErrStateConflict", key, i, err)
			}
		}
		if got := e.get("s", key); won != 1 || got.ReconcileAttempts != 1 || got.DeadLettered() != dead {
			t.Fatalf("%s: %d deferrals applied, %d attempts, dead-lettered %v; want 1, 1, %v", key, won, got.ReconcileAttempts, got.DeadLettered(), dead)
		}
	}
}
