package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

func TestParseScope(t *testing.T) {
	for _, req := range []idem.Request{
		{Tenant: "", Method: "POST", Route: "/v1/charges"},
		{Tenant: "acct:7 x", Method: "PATCH", Route: "/v1/a b/{id}"},
		{Tenant: "12:34", Method: "POST", Route: ""},
	} {
		tenant, method, route, ok := idem.ParseScope(req.Scope())
		if !ok || tenant != req.Tenant || method != req.Method || route != req.Route {
			t.Fatalf("ParseScope(%q) = %q %q %q %v", req.Scope(), tenant, method, route, ok)
		}
	}
	for _, bad := range []string{"", "x", "5:ab", "-1:", "3:abcPOST", "0: /x"} {
		if _, _, _, ok := idem.ParseScope(bad); ok {
			t.Fatalf("ParseScope(%q) accepted", bad)
		}
	}
}

// stepClock is a manual clock for the engine: Advance runs the timers
// that fall due, in order, each at its own instant, before returning.
type stepClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*stepTimer]bool
}

type stepTimer struct {
	c    *stepClock
	when time.Time
	f    func()
}

func newStepClock() *stepClock {
	return &stepClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), timers: map[*stepTimer]bool{}}
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

func (c *stepClock) AfterFunc(d time.Duration, f func()) idem.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &stepTimer{c: c, when: c.now.Add(d), f: f}
	c.timers[t] = true
	return t
}

func (t *stepTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	active := t.c.timers[t]
	delete(t.c.timers, t)
	return active
}

func (t *stepTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	active := t.c.timers[t]
	t.when = t.c.now.Add(d)
	t.c.timers[t] = true
	return active
}

func (c *stepClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		var next *stepTimer
		for t := range c.timers {
			if !t.when.After(end) && (next == nil || t.when.Before(next.when)) {
				next = t
			}
		}
		if next == nil {
			break
		}
		delete(c.timers, next)
		if next.when.After(c.now) {
			c.now = next.when
		}
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

// heldRequest sends one keyed POST to h in the background; the handler
// built by holdingHandler blocks until release is closed.
func holdingHandler(started chan<- *idem.Execution, release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		started <- idem.FromContext(r.Context())
		<-release
		w.WriteHeader(http.StatusCreated)
	}
}

// holdKey sends one keyed request through e in the background, to a
// handler that holds it until release, which then waits for its answer.
func holdKey(e *idem.Engine) (release func()) {
	started, hold := make(chan *idem.Execution, 1), make(chan struct{})
	h := e.Middleware(holdingHandler(started, hold))
	done := make(chan struct{})
	go func() { sendKeyed(h, "k"); close(done) }()
	<-started
	return func() { close(hold); <-done }
}

func sendKeyed(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/slow", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The heartbeat renews the lease a third into it: a duplicate arriving
// after the first lease would have lapsed still finds the request in
// progress, and the store's lease runs a full Lease from the renewal.
func TestHeartbeatRenewsAThirdIntoTheLease(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	s := memory.New(memory.Config{Clock: clk.Now})
	e, err := idem.New(s, idem.Config{Lease: 30 * time.Second, LeasePolicy: store.LeaseRetry, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	started, release := make(chan *idem.Execution, 2), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	h := e.Middleware(holdingHandler(started, release))
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- sendKeyed(h, "slow-1") }()
	<-started
	t0 := clk.Now()

	clk.Advance(11 * time.Second)
	rec, err := s.Get(context.Background(), "0:POST /v1/slow", "slow-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(10*time.Second + 30*time.Second); !rec.LockedUntil.Equal(want) {
		t.Fatalf("after 11s the lease runs until +%v, want +40s (renewed at +10s)", rec.LockedUntil.Sub(t0))
	}
	clk.Advance(20 * time.Second) // +31s: the first lease would have lapsed
	if w := sendKeyed(h, "slow-1"); w.Code != http.StatusConflict {
		t.Fatalf("duplicate after the first lease: %d, want 409 (lease renewed)", w.Code)
	}
	// The handler outlives many leases: the heartbeat keeps renewing.
	for range 30 {
		clk.Advance(10 * time.Second)
	}
	if w := sendKeyed(h, "slow-1"); w.Code != http.StatusConflict {
		t.Fatalf("duplicate ten leases later: %d, want 409 (lease renewed)", w.Code)
	}
	once.Do(func() { close(release) })
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("original: %d", w.Code)
	}
}

// Executions started at different times are each renewed a third into
// their own lease (the engine queues first renewals behind one timer), and
// one that ended first is not renewed at all.
func TestHeartbeatsKeepEachExecutionsTime(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	s := memory.New(memory.Config{Clock: clk.Now})
	obs := &obstest.Recorder{}
	e, err := idem.New(s, idem.Config{Lease: 30 * time.Second, LeasePolicy: store.LeaseRetry, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	holds := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{}), "c": make(chan struct{})}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-holds[idem.FromContext(r.Context()).Key()]
		w.WriteHeader(http.StatusCreated)
	}))
	t0 := clk.Now()
	start := func(key string) chan *httptest.ResponseRecorder {
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- sendKeyed(h, key) }()
		waitFor(t, "reservation of "+key, func() bool {
			_, err := s.Get(context.Background(), "0:POST /v1/slow", key)
			return err == nil
		})
		return done
	}
	lockedUntil := func(key string) time.Duration {
		rec, err := s.Get(context.Background(), "0:POST /v1/slow", key)
		if err != nil {
			t.Fatal(err)
		}
		return rec.LockedUntil.Sub(t0)
	}
	a := start("a")
	clk.Advance(5 * time.Second)
	b := start("b")
	c := start("c")
	close(holds["c"]) // c ends before its first renewal
	if w := <-c; w.Code != http.StatusCreated {
		t.Fatalf("c: %d", w.Code)
	}
	clk.Advance(5 * time.Second) // +10s: a's renewal
	if got := lockedUntil("a"); got != 40*time.Second {
		t.Fatalf("a's lease runs until +%v, want +40s (renewed at +10s)", got)
	}
	if got := lockedUntil("b"); got != 35*time.Second {
		t.Fatalf("b's lease runs until +%v, want +35s (not renewed before +15s)", got)
	}
	clk.Advance(5 * time.Second) // +15s: b's renewal
	if got := lockedUntil("b"); got != 45*time.Second {
		t.Fatalf("b's lease runs until +%v, want +45s (renewed at +15s)", got)
	}
	clk.Advance(5 * time.Second) // +20s: a's second renewal, from its own timer
	if got := lockedUntil("a"); got != 50*time.Second {
		t.Fatalf("a's lease runs until +%v, want +50s (renewed again at +20s)", got)
	}
	close(holds["a"])
	close(holds["b"])
	for _, d := range []chan *httptest.ResponseRecorder{a, b} {
		if w := <-d; w.Code != http.StatusCreated {
			t.Fatalf("%d", w.Code)
		}
	}
	if n := obs.StoreCalls()["extend"]; n != 3 {
		t.Fatalf("%d renewals, want 3: a's two and b's one", n)
	}
}

// A renewal that finds the record taken over tells the handler: LeaseLost
// turns true, so it can stop before its completion is refused.
func TestLeaseLostIsReported(t *testing.T) {
	t.Parallel()
	engineClock, storeClock := newStepClock(), storetest.NewClock()
	s := memory.New(memory.Config{Clock: storeClock.Now})
	e, err := idem.New(s, idem.Config{Lease: 30 * time.Second, LeasePolicy: store.LeaseRetry, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, engineClock)
	var calls atomic.Int64
	entered, proceed, lost := make(chan struct{}), make(chan struct{}), make(chan bool, 1)
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(entered)
			<-proceed
			lost <- idem.FromContext(r.Context()).LeaseLost()
		}
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan struct{})
	go func() { sendKeyed(h, "k"); close(done) }()
	<-entered
	storeClock.Advance(31 * time.Second) // the holder is cut off: its lease lapses in store time
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || calls.Load() != 2 {
		t.Fatalf("takeover: %d after %d calls", w.Code, calls.Load())
	}
	engineClock.Advance(11 * time.Second) // the first holder's heartbeat
	close(proceed)
	if !<-lost {
		t.Fatal("LeaseLost is false after a renewal found the record taken over")
	}
	<-done
}

// A holder cut off from the store (every renewal fails) cannot know
// whether the store still counts it the holder once a whole Lease passed
// since its last renewal: LeaseLost turns true then, so that a handler
// (package phase) stops before a side effect, as another instance may
// already have taken the key over and be running it.
func TestLeaseLostOnceRenewalsFailedForALease(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{Clock: clk.Now})}
	e, err := idem.New(s, idem.Config{Lease: 30 * time.Second, LeasePolicy: store.LeaseRetry, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	var calls atomic.Int64
	started, proceed, lost := make(chan *idem.Execution, 1), make(chan struct{}), make(chan bool, 1)
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			x := idem.FromContext(r.Context())
			started <- x
			<-proceed
			lost <- x.LeaseLost()
		}
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan struct{})
	go func() { sendKeyed(h, "k"); close(done) }()
	x := <-started
	s.ExtendsAlways.Store(true) // this instance is cut off from the store
	clk.Advance(29 * time.Second)
	if x.LeaseLost() {
		t.Fatal("LeaseLost within the lease")
	}
	clk.Advance(2 * time.Second)
	// Another instance, which reaches the store, takes the key over.
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || calls.Load() != 2 {
		t.Fatalf("takeover: %d after %d calls", w.Code, calls.Load())
	}
	close(proceed)
	if !<-lost {
		t.Fatal("LeaseLost is false a whole Lease after the last renewal, every renewal since failed")
	}
	<-done
}

// A handler that completed the key in its own transaction (CompleteTx,
// then Committed) holds no lease any more: the heartbeat stops, so a
// renewal due before the handler returns neither reports the lease lost
// nor logs it.
func TestCommittedStopsTheHeartbeat(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	s := memory.New(memory.Config{Clock: clk.Now})
	logs := &enginetest.Logs{}
	e, err := idem.New(s, idem.Config{Lease: 30 * time.Second, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	committed, proceed := make(chan *idem.Execution, 1), make(chan struct{})
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := idem.FromContext(r.Context())
		// What CompleteTx does in the handler's transaction, on a store
		// without transactions.
		resp := store.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("made")}
		if err := s.Complete(r.Context(), x.CompleteParams(resp)); err != nil {
			t.Error(err)
		}
		x.Committed()
		committed <- x
		<-proceed
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- sendKeyed(h, "k") }()
	x := <-committed
	clk.Advance(11 * time.Second) // past the renewal that was due at 10s
	if x.LeaseLost() || len(logs.At(slog.LevelWarn)) != 0 || len(logs.At(slog.LevelError)) != 0 {
		t.Fatalf("LeaseLost %v, warnings %q, errors %q after the handler's own completion: want none",
			x.LeaseLost(), logs.At(slog.LevelWarn), logs.At(slog.LevelError))
	}
	close(proceed)
	if w := <-done; w.Code != http.StatusCreated || w.Body.String() != "made" {
		t.Fatalf("answer: %d %q", w.Code, w.Body)
	}
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || w.Body.String() != "made" || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q, want the stored answer replayed", w.Code, w.Body)
	}
}

// A failed renewal is retried soon, not a whole Lease/3 later: a short
// outage must not eat the lease.
func TestRenewalRetriesSoonAfterAFailure(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{Clock: clk.Now})}
	e, err := idem.New(s, idem.Config{Lease: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	release := holdKey(e)
	s.FailExtends.Store(1)
	clk.Advance(10 * time.Second)
	if n := s.Extends.Load(); n != 1 {
		t.Fatalf("%d renewals at +10s, want 1", n)
	}
	clk.Advance(2 * time.Second)
	if n := s.Extends.Load(); n != 2 {
		t.Fatalf("%d renewals at +12s, want 2 (the failed one retried within a thirtieth of the lease)", n)
	}
	release()
}

// scriptedExtends records when each lease renewal reached the store and
// fails those that fail says should.
type scriptedExtends struct {
	store.Store
	clk  *stepClock
	fail []bool
	mu   sync.Mutex
	at   []time.Time
}

func (s *scriptedExtends) Extend(ctx context.Context, p store.ExtendParams) error {
	s.mu.Lock()
	n := len(s.at)
	s.at = append(s.at, s.clk.Now())
	s.mu.Unlock()
	if n < len(s.fail) && s.fail[n] {
		return store.Retryable(errors.New("connection refused"))
	}
	return s.Store.Extend(ctx, p)
}

func (s *scriptedExtends) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.at)
}

// Failed renewals are retried after a thirtieth of the lease, doubling
// (with jitter, between half and all of each pause), so that a short outage
// does not eat the lease and a long one is not hammered; a renewal that
// succeeds starts the count again, and the next one is due Lease/3 later.
func TestRenewalBackoffDoublesAndResets(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	clk := newStepClock()
	s := &scriptedExtends{Store: memory.New(memory.Config{Clock: clk.Now}), clk: clk,
		fail: []bool{true, true, true, false, true, false}}
	e, err := idem.New(s, idem.Config{Lease: lease, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	release := holdKey(e)
	for i := 0; i < 600 && len(s.times()) < 7; i++ {
		clk.Advance(100 * time.Millisecond)
	}
	at := s.times()
	if len(at) < 7 {
		t.Fatalf("%d renewals in a minute", len(at))
	}
	step := lease / 30
	want := []struct{ lo, hi time.Duration }{
		{step / 2, step},       // after the first failure
		{step, 2 * step},       // the second
		{2 * step, 4 * step},   // the third
		{lease / 3, lease / 3}, // after a success
		{step / 2, step},       // a failure after a success: the count started again
		{lease / 3, lease / 3},
	}
	for i, w := range want {
		if gap := at[i+1].Sub(at[i]); gap < w.lo || gap > w.hi {
			t.Errorf("pause %d: %v, want between %v and %v (renewals at %v)", i+1, gap, w.lo, w.hi, at)
		}
	}
	release()
}

// The log of an outcome not recorded in time says what the lease policy
// makes of the record: under retry and resume it never becomes unknown.
func TestCompletionGivesUpLogsThePolicy(t *testing.T) {
	t.Parallel()
	for policy, want := range map[store.LeasePolicy]string{
		store.LeaseRetry:  "the next retry after its lease expires runs the request again",
		store.LeaseResume: "the next retry after its lease expires resumes the request",
	} {
		s := &enginetest.Flaky{Store: memory.New(memory.Config{})}
		s.FailCompletes.Store(1 << 30)
		s.ExtendsAlways.Store(true)
		var logs bytes.Buffer
		e, err := idem.New(s, idem.Config{Lease: 300 * time.Millisecond, LeasePolicy: policy, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		sendKeyed(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})), "k")
		if got := logs.String(); !strings.Contains(got, want) || strings.Contains(got, "unknown") {
			t.Errorf("%s: logged %s", policy, got)
		}
	}
}

// When the store stays down until the lease would lapse, the engine gives
// up: the client gets the answer it earned, nothing is released, and the
// record becomes unknown once its lease expires.
func TestCompletionGivesUpWhenTheLeaseWouldLapse(t *testing.T) {
	t.Parallel()
	storeClock := storetest.NewClock()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{Clock: storeClock.Now})}
	s.FailCompletes.Store(1 << 30)
	s.ExtendsAlways.Store(true)
	var logs bytes.Buffer
	e, err := idem.New(s, idem.Config{Lease: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || w.Body.String() != "made" {
		t.Fatalf("answer when the store is down: %d %q", w.Code, w.Body)
	}
	if !strings.Contains(logs.String(), "could not record the outcome in time; the record becomes unknown") {
		t.Fatalf("no log of the lost outcome: %s", logs.String())
	}
	storeClock.Advance(time.Second)
	rec, err := s.Get(context.Background(), "0:POST /v1/slow", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StateInProgress || !rec.LeaseExpired(storeClock.Now()) {
		t.Fatalf("record %s, want in progress with its lease expired (never released)", rec.State)
	}
	if w := sendKeyed(h, "k"); w.Code != http.StatusConflict {
		t.Fatalf("retry after the lost completion: %d, want 409 outcome unknown", w.Code)
	}
}

// A release that meets a store blip is retried like a completion: the
// client's 5xx arrives once the key is free, so its retry runs again
// instead of finding the request still in progress.
func TestReleaseIsRetried(t *testing.T) {
	t.Parallel()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{})}
	s.FailReleases.Store(2)
	e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if w := sendKeyed(h, "k"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", w.Code)
	}
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || calls.Load() != 2 {
		t.Fatalf("retry after a released failure: %d after %d calls, want 201 from a second run", w.Code, calls.Load())
	}
	if n := s.Releases.Load(); n != 3 {
		t.Fatalf("%d release attempts, want 3", n)
	}
}

// maker is the engine on s with cfg around a handler that answers 201
// "made".
func maker(t *testing.T, s store.Store, cfg idem.Config) http.Handler {
	t.Helper()
	e, err := idem.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
}

// A completion that outlasts the engine's own per-call timeout
// (Config.StoreTimeout) is a slow store, not an answer about the record: it
// is tried again while the lease lasts, and the answer is recorded.
func TestCompletionPastTheStoreTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{})}
	s.StallCompletes.Store(1)
	h := maker(t, s, idem.Config{Logger: slog.New(slog.DiscardHandler), StoreTimeout: 20 * time.Millisecond})
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if n := s.Completes.Load(); n != 2 {
		t.Fatalf("%d completion attempts, want 2 (the timed-out one, then its retry)", n)
	}
	if w := sendKeyed(h, "k"); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "made" {
		t.Fatalf("retry: %d %q, want the recorded answer replayed", w.Code, w.Body)
	}
}

// A duplicate that waits (Config.Wait) for a holder that has died (its
// lease ran out: here its renewals fail) does not wait out its whole
// Wait: it notices the lapsed lease and lets the lease policy decide; with
// LeaseRetry it takes the request over and answers it.
func TestWaitingDuplicateNoticesALapsedLease(t *testing.T) {
	t.Parallel()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{})}
	s.ExtendsAlways.Store(true)
	e, err := idem.New(s, idem.Config{Lease: 300 * time.Millisecond, LeasePolicy: store.LeaseRetry,
		Wait: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(started)
			<-release // the first holder hangs, and its lease lapses
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan struct{})
	go func() { sendKeyed(h, "k"); close(first) }()
	defer func() { close(release); <-first }()
	<-started
	// Had it waited out its Wait, it would get 409: the record is still
	// in progress, under a lease nobody renews.
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated || calls.Load() != 2 {
		t.Fatalf("duplicate of a dead holder: %d after %d calls, want 201 from a takeover", w.Code, calls.Load())
	}
}

// Duplicates of one key waiting in one process share each store read: with
// the store's reads held up, eight waiting duplicates have one read under
// way, not eight. Once the holder answers, every one of them gets its
// answer, replayed.
func TestWaitingDuplicatesShareReads(t *testing.T) {
	t.Parallel()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{}), GetGate: make(chan struct{})}
	e, err := idem.New(s, idem.Config{Wait: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- sendKeyed(h, "k") }()
	<-started
	const n = 8
	answers := make(chan *httptest.ResponseRecorder, n)
	for range n {
		go func() { answers <- sendKeyed(h, "k") }()
	}
	for deadline := time.Now().Add(time.Minute); s.Reserves.Load() < n+1 || s.Gets.Load() < 1; {
		if time.Now().After(deadline) {
			t.Fatalf("%d reservations and %d reads after a minute", s.Reserves.Load(), s.Gets.Load())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // time for any other read to reach the store
	if got := s.Gets.Load(); got != 1 {
		t.Fatalf("%d store reads under way for %d waiting duplicates, want 1", got, n)
	}
	close(s.GetGate)
	close(release)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	for range n {
		if w := <-answers; w.Code != http.StatusCreated || w.Body.String() != "made" ||
			w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("a waiting duplicate: %d %q %v, want the answer replayed", w.Code, w.Body, w.Header())
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("the handler ran %d times", calls.Load())
	}
}

// A completion applied by the store whose answer was lost (the connection
// broke after the commit) is recognised when the retry finds the record
// completed under this execution's fence: recorded, not lost. When the
// read that recognises it fails once, the engine reads again: the answer
// is not given up as another execution's.
func TestCompletionWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	for _, failedReads := range []int64{0, 1} {
		t.Run(fmt.Sprintf("failed reads %d", failedReads), func(t *testing.T) {
			t.Parallel()
			s := &enginetest.Flaky{Store: memory.New(memory.Config{})}
			s.LoseAnswers.Store(1)
			s.FailGets.Store(failedReads)
			var logs bytes.Buffer
			h := maker(t, s, idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if w := sendKeyed(h, "k"); w.Code != http.StatusCreated {
				t.Fatalf("first: %d", w.Code)
			}
			if w := sendKeyed(h, "k"); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "made" {
				t.Fatalf("retry: %d %q", w.Code, w.Body)
			}
			if strings.Contains(logs.String(), "no longer holds") || strings.Contains(logs.String(), "could not confirm") ||
				!strings.Contains(logs.String(), "outcome recorded after retries") {
				t.Fatalf("logs: %s", logs.String())
			}
			if s.FailGets.Load() >= 0 {
				t.Fatal("the read that recognises the lost completion was not made, or not made again after it failed")
			}
		})
	}
}
