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
)

type breakerEnv struct {
	t    *testing.T
	clk  *stepClock
	st   *enginetest.Flaky
	e    *idem.Engine
	h    http.Handler
	obs  *obstest.Recorder
	logs *bytes.Buffer
	runs atomic.Int64
	n    int
}

func newBreakerEnv(t *testing.T, cfg idem.Config) *breakerEnv {
	t.Helper()
	return newBreakerEnvOver(t, cfg, nil)
}

// newBreakerEnvOver is newBreakerEnv with the engine over wrap's store
// around the Flaky one (wrap nil: the Flaky store itself).
func newBreakerEnvOver(t *testing.T, cfg idem.Config, wrap func(*enginetest.Flaky) store.Store) *breakerEnv {
	t.Helper()
	clk := newStepClock()
	b := &breakerEnv{t: t, clk: clk, st: &enginetest.Flaky{Store: memory.New(memory.Config{Clock: clk.Now})},
		obs: &obstest.Recorder{}, logs: &bytes.Buffer{}}
	cfg.Observer = b.obs
	cfg.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: b.logs}, nil))
	var s store.Store = b.st
	if wrap != nil {
		s = wrap(b.st)
	}
	e, err := idem.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	b.e = e
	b.h = e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	return b
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// send sends a request with a new key and returns the status and
// Retry-After.
func (b *breakerEnv) send() (int, string) {
	b.n++
	w := sendKeyed(b.h, fmt.Sprint("k-", b.n))
	return w.Code, w.Header().Get("Retry-After")
}

func (b *breakerEnv) want(status int, what string) string {
	b.t.Helper()
	got, ra := b.send()
	if got != status {
		b.t.Fatalf("%s: status %d, want %d", what, got, status)
	}
	return ra
}

// The breaker opens after BreakerFailures failed reservations in a row,
// answers 503 without calling the store while open, lets one probe
// through once the interval passed, opens again for twice as long when
// the probe fails, and closes when a probe succeeds.
func TestBreakerOpensProbesAndCloses(t *testing.T) {
	t.Parallel()
	b := newBreakerEnv(t, idem.Config{BreakerFailures: 3, BreakerOpen: 2 * time.Second, BreakerMaxOpen: 5 * time.Second})
	b.st.Down.Store(true)
	for i := range 3 {
		b.want(503, fmt.Sprint("failure ", i+1))
	}
	if got := b.st.Reserves.Load(); got != 3 {
		t.Fatalf("%d reservations reached the store, want 3", got)
	}
	if b.obs.Events()["breaker_opened"] != 1 || !strings.Contains(b.logs.String(), "circuit breaker opened") {
		t.Fatalf("opening not reported: events %v, log %s", b.obs.Events(), b.logs)
	}

	// Open: refused at once, the store untouched, Retry-After the time left.
	if ra := b.want(503, "while open"); ra != "2" {
		t.Fatalf("Retry-After %q while open, want 2", ra)
	}
	b.clk.Advance(time.Second)
	b.want(503, "still open")
	if got := b.st.Reserves.Load(); got != 3 {
		t.Fatalf("the store was called while the breaker was open: %d reservations", got)
	}
	// Each failed reservation was read back once (it may have been made,
	// its answer lost); a refusal of the breaker called no store, and
	// reads nothing back itself. The reservations that could not be read
	// back are remembered: the second refusal, past the sweeps' first
	// wait, started a sweep, whose first read failed and ended it.
	if n := idem.WaitLost(b.e); n == 0 {
		t.Fatal("no reservation remembered")
	}
	if got := b.st.Gets.Load(); got != 4 {
		t.Fatalf("%d reads after 3 failed reservations, 2 refusals and a sweep, want 4", got)
	}

	// Half-open: the probe reaches the store, fails, and the breaker opens
	// again for twice as long.
	b.clk.Advance(time.Second)
	b.want(503, "failed probe")
	if got := b.st.Reserves.Load(); got != 4 {
		t.Fatalf("the probe did not reach the store: %d reservations", got)
	}
	if ra := b.want(503, "reopened"); ra != "4" {
		t.Fatalf("Retry-After %q after a failed probe, want 4 (the interval doubled)", ra)
	}
	b.clk.Advance(4 * time.Second)
	b.want(503, "second failed probe")
	if ra := b.want(503, "reopened at the bound"); ra != "5" {
		t.Fatalf("Retry-After %q, want 5 (BreakerMaxOpen)", ra)
	}
	if got := b.obs.Events()["breaker_opened"]; got != 3 {
		t.Fatalf("breaker_opened = %d, want 3", got)
	}

	// The store is back: the next probe closes the breaker.
	b.st.Down.Store(false)
	b.clk.Advance(5 * time.Second)
	b.want(201, "successful probe")
	b.want(201, "closed")
	if b.obs.Events()["breaker_closed"] != 1 || !strings.Contains(b.logs.String(), "circuit breaker closed") {
		t.Fatalf("closing not reported: events %v, log %s", b.obs.Events(), b.logs)
	}
	if got := b.runs.Load(); got != 2 {
		t.Fatalf("the handler ran %d times, want 2 (never while the store was refused)", got)
	}

	// Closed again, it takes BreakerFailures failures in a row to open it,
	// and the interval starts over from BreakerOpen.
	b.st.Down.Store(true)
	for i := range 3 {
		b.want(503, fmt.Sprint("failure ", i+1, " after closing"))
	}
	if ra := b.want(503, "open again"); ra != "2" {
		t.Fatalf("Retry-After %q, want 2 (the interval starts over)", ra)
	}
}

// A success between failures starts the count over: the breaker needs
// failures in a row.
func TestBreakerNeedsFailuresInARow(t *testing.T) {
	t.Parallel()
	b := newBreakerEnv(t, idem.Config{BreakerFailures: 2})
	for range 3 {
		b.st.Down.Store(true)
		b.want(503, "failure")
		b.st.Down.Store(false)
		b.want(201, "success")
	}
	if got := b.obs.Events()["breaker_opened"]; got != 0 {
		t.Fatalf("breaker opened %d times on alternating failures", got)
	}
}

// A tenant at its cap is refused by the store (ErrOverCap): an answer
// about the tenant, not a store failure. However many such refusals come
// in a row, the breaker stays closed for every other request.
func TestBreakerIgnoresRefusalsAtTheTenantCap(t *testing.T) {
	t.Parallel()
	b := newBreakerEnv(t, idem.Config{BreakerFailures: 2, TenantMaxActive: 1})
	held := store.ReserveParams{Scope: "0:POST /v1/held", Key: "held", Fingerprint: "f", Lease: time.Hour, TTL: time.Hour,
		LeasePolicy: store.LeaseUnknown}
	res, err := b.st.Reserve(context.Background(), held)
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		b.want(http.StatusTooManyRequests, "a new key at the tenant's cap")
	}
	if err := b.st.Release(context.Background(), store.ReleaseParams{FenceParams: store.FenceParams{
		Scope: held.Scope, Key: held.Key, Fence: res.Record.Fence}}); err != nil {
		t.Fatal(err)
	}
	b.want(http.StatusCreated, "a new key once the cap has room")
	if got := b.obs.Events()["breaker_opened"]; got != 0 {
		t.Fatalf("breaker opened %d times on refusals at the tenant cap", got)
	}
}

// A reservation that fails after its caller left (a client that hung up)
// tells nothing about the store: a burst of them does not open the
// breaker for the clients that stay.
func TestBreakerIgnoresFailuresOfCallersThatLeft(t *testing.T) {
	t.Parallel()
	b := newBreakerEnv(t, idem.Config{BreakerFailures: 2})
	b.st.Down.Store(true)
	for i := range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := httptest.NewRequestWithContext(ctx, "POST", "/v1/slow", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", fmt.Sprint("gone-", i))
		b.h.ServeHTTP(httptest.NewRecorder(), r)
	}
	b.st.Down.Store(false)
	b.want(http.StatusCreated, "a request after callers that left")
	if got := b.obs.Events()["breaker_opened"]; got != 0 {
		t.Fatalf("breaker opened %d times on failures of callers that had left", got)
	}
}

// countingFlaky is a Flaky store that counts its active records
// (StoreMaxActive) and the calls that count them.
type countingFlaky struct {
	*enginetest.Flaky
	counts atomic.Int64
}

func (c *countingFlaky) CountActive(ctx context.Context, limit int) (int, error) {
	c.counts.Add(1)
	return c.Flaky.Store.(store.ActiveCounter).CountActive(ctx, limit)
}

// The count behind StoreMaxActive is a store call like the reservation:
// while the breaker is open it is refused without calling the store, and
// the client gets the breaker's 503 at once.
func TestBreakerGatesTheActiveCount(t *testing.T) {
	t.Parallel()
	var c *countingFlaky
	b := newBreakerEnvOver(t, idem.Config{BreakerFailures: 2, BreakerOpen: 10 * time.Second, StoreMaxActive: 100},
		func(f *enginetest.Flaky) store.Store { c = &countingFlaky{Flaky: f}; return c })
	b.st.Down.Store(true)
	b.want(http.StatusServiceUnavailable, "first failure")
	b.want(http.StatusServiceUnavailable, "second failure: the breaker opens")
	counts := c.counts.Load()
	b.clk.Advance(2 * idem.DefaultStoreActiveRecount) // a new count falls due
	b.want(http.StatusServiceUnavailable, "while the breaker is open")
	if got := c.counts.Load(); got != counts {
		t.Fatalf("the store counted its active records %d times while the breaker was open", got-counts)
	}
}

// Half-open, one probe at a time: while the probe waits for the store,
// other requests get 503 without calling it.
func TestBreakerSingleProbe(t *testing.T) {
	t.Parallel()
	b := newBreakerEnv(t, idem.Config{BreakerFailures: 1, BreakerOpen: time.Second})
	b.st.Down.Store(true)
	b.want(503, "failure")
	b.st.Down.Store(false)
	b.clk.Advance(time.Second)

	b.st.Gate = make(chan struct{})
	probe := make(chan int)
	go func() {
		w := sendKeyed(b.h, "probe")
		probe <- w.Code
	}()
	for b.st.Reserves.Load() < 2 {
		time.Sleep(time.Millisecond) // until the probe is inside the store
	}
	for i := range 5 {
		w := sendKeyed(b.h, fmt.Sprint("other-", i))
		if w.Code != 503 || w.Header().Get("Retry-After") == "" {
			t.Fatalf("request during the probe: %d (Retry-After %q), want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
		}
	}
	if got := b.st.Reserves.Load(); got != 2 {
		t.Fatalf("%d reservations reached the store during the probe, want only the probe's", got)
	}
	close(b.st.Gate)
	if code := <-probe; code != 201 {
		t.Fatalf("probe: %d", code)
	}
	b.want(201, "after the probe closed the breaker")
}

// Timeouts count as failures: a store slower than StoreTimeout opens the
// breaker, and requests then stop waiting for it.
func TestBreakerCountsTimeouts(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	st := &enginetest.Flaky{Store: memory.New(memory.Config{Clock: clk.Now})}
	e, err := idem.New(&slowReserve{Flaky: st, clk: clk, d: 2 * time.Second},
		idem.Config{BreakerFailures: 2, StoreTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	ctx := context.Background()
	call := func(key string) idem.Answer {
		return e.Run(ctx, idem.Call{Method: "POST", Route: "/x", Keys: []string{key}}, func(context.Context) idem.Result {
			return idem.Result{Response: store.Response{Status: 201}}
		})
	}
	for i := range 2 {
		if a := call(fmt.Sprint("t", i)); a.Verdict != idem.Unavailable || !errors.Is(a.Err, context.DeadlineExceeded) {
			t.Fatalf("slow reservation %d: %v %v", i, a.Verdict, a.Err)
		}
	}
	a := call("t-open")
	if a.Verdict != idem.Unavailable || !errors.Is(a.Err, idem.ErrBreakerOpen) || !errors.Is(a.Err, idem.ErrStore) {
		t.Fatalf("after two timeouts: %v %v, want the breaker's refusal", a.Verdict, a.Err)
	}
	if got := st.Reserves.Load(); got != 2 {
		t.Fatalf("%d reservations reached the store, want 2", got)
	}
}

// slowReserve makes every reservation outlast its deadline on the step
// clock: it moves the clock past the store timeout and reports the
// deadline.
type slowReserve struct {
	*enginetest.Flaky
	clk *stepClock
	d   time.Duration
}

func (s *slowReserve) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	s.Reserves.Add(1)
	s.clk.Advance(s.d)
	<-ctx.Done()
	return store.ReserveResult{}, ctx.Err()
}

// A negative BreakerFailures disables the breaker: every request waits for
// the store.
func TestBreakerDisabled(t *testing.T) {
	t.Parallel()
	b := newBreakerEnv(t, idem.Config{BreakerFailures: -1})
	b.st.Down.Store(true)
	for range 20 {
		b.want(503, "failure")
	}
	if got := b.st.Reserves.Load(); got != 20 {
		t.Fatalf("%d reservations reached the store, want 20", got)
	}
}

func TestBreakerConfigErrors(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idem.Config{
		"max shorter than open": {BreakerOpen: time.Minute, BreakerMaxOpen: time.Second},
		"negative open":         {BreakerOpen: -time.Second},
	} {
		if _, err := idem.New(memory.New(memory.Config{}), cfg); err == nil || !strings.Contains(err.Error(), "Breaker") {
			t.Errorf("%s: %v, want an error naming the field", name, err)
		}
	}
}

// A completion whose answer was lost is recognised by reading the record
// back; the store's circuit breaker, opened meanwhile by other requests'
// reservations during the same outage, must not refuse that read (it is a
// running execution's), or an answer that is stored would be reported as
// not recorded: no Idempotency-Key-Expires, an error in the log.
func TestLostCompletionAnswerRecognisedWithTheBreakerOpen(t *testing.T) {
	t.Parallel()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{})}
	var logs bytes.Buffer
	e, err := idem.New(s, idem.Config{BreakerOpen: time.Minute, BreakerMaxOpen: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "k" {
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	first := make(chan *http.Response, 1)
	go func() { first <- sendKeyed(h, "k").Result() }()
	<-started
	s.Down.Store(true) // an outage: other requests' reserves fail and open the breaker
	for i := range 6 {
		if w := sendKeyed(h, fmt.Sprint("other", i)); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("other request during the outage: %d", w.Code)
		}
	}
	s.Down.Store(false) // the store is back; the breaker stays open for a minute
	s.LoseAnswers.Store(1)
	close(release)
	resp := <-first
	rec, err := s.Store.Get(context.Background(), "0:POST /v1/slow", "k")
	if err != nil || rec.State != store.StateCompleted || string(rec.Response.Body) != "made" {
		t.Fatalf("record: %v %v", rec.State, err)
	}
	if resp.Header.Get("Idempotency-Key-Expires") == "" || strings.Contains(logs.String(), "no longer holds") {
		t.Fatalf("a stored answer reported as not recorded; logs:\n%s", logs.String())
	}
}

// staleReserve holds the reservations of keys starting with "stale" until
// the test says how each ends: calls sent to a store that hung, answered
// (with a failure) long after they started.
type staleReserve struct {
	*enginetest.Flaky
	held chan error
}

func (s *staleReserve) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if strings.HasPrefix(p.Key, "stale") {
		s.Reserves.Add(1)
		if err := <-s.held; err != nil {
			return store.ReserveResult{}, err
		}
	}
	return s.Flaky.Reserve(ctx, p)
}

// The failures of calls that started before the breaker closed say
// nothing about the store that answered the probe: calls stuck in a store
// that hung fail one after the other once a probe found it back, and must
// not open the breaker again against a store that answers.
func TestBreakerIgnoresFailuresOfCallsOlderThanItsClosing(t *testing.T) {
	t.Parallel()
	var st *staleReserve
	b := newBreakerEnvOver(t, idem.Config{BreakerFailures: 2, BreakerOpen: time.Second}, func(f *enginetest.Flaky) store.Store {
		st = &staleReserve{Flaky: f, held: make(chan error)}
		return st
	})

	codes := make(chan int, 4)
	for i := range 4 {
		go func() { codes <- sendKeyed(b.h, fmt.Sprint("stale-", i)).Code }()
	}
	for st.Reserves.Load() < 4 {
		time.Sleep(time.Millisecond) // until all four wait in the store
	}
	for range 2 {
		st.held <- enginetest.ErrOutage
		if code := <-codes; code != http.StatusServiceUnavailable {
			t.Fatalf("failed reservation: %d", code)
		}
	}
	b.want(http.StatusServiceUnavailable, "breaker open")
	b.clk.Advance(time.Second)
	b.want(http.StatusCreated, "the probe finds the store back")

	for range 2 {
		st.held <- enginetest.ErrOutage
		if code := <-codes; code != http.StatusServiceUnavailable {
			t.Fatalf("stale reservation: %d", code)
		}
	}
	b.want(http.StatusCreated, "after the stale failures, with the store answering")
}

// panicReserve panics in the next reservation once armed: a store (or
// driver) bug met while the store recovers.
type panicReserve struct {
	*enginetest.Flaky
	armed atomic.Bool
}

func (s *panicReserve) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if s.armed.CompareAndSwap(true, false) {
		panic("store bug")
	}
	return s.Flaky.Reserve(ctx, p)
}

// A probe that never reports back (its store call panicked, or hung past
// its deadline) must not leave the breaker half-open for good, refusing
// every request while the store answers: once the probe's store timeout
// passed, another request probes.
func TestBreakerProbeThatPanickedIsReplaced(t *testing.T) {
	t.Parallel()
	var st *panicReserve
	b := newBreakerEnvOver(t, idem.Config{BreakerFailures: 1, BreakerOpen: time.Second, StoreTimeout: 2 * time.Second},
		func(f *enginetest.Flaky) store.Store {
			st = &panicReserve{Flaky: f}
			return st
		})
	b.st.Down.Store(true)
	b.want(http.StatusServiceUnavailable, "failure")
	b.st.Down.Store(false)
	b.clk.Advance(time.Second)
	st.armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the store's panic did not reach the caller")
			}
		}()
		b.send()
	}()
	b.want(http.StatusServiceUnavailable, "while the probe could still be running")
	b.clk.Advance(2 * time.Second)
	b.want(http.StatusCreated, "a new probe once the first one's store timeout passed")
	b.want(http.StatusCreated, "closed")
}
