package idem_test

import (
	"bytes"
	"context"
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

// flakyStore injects transient failures into a real store: the next N
// calls of an operation fail as a dropped connection would.
type flakyStore struct {
	store.Store
	failCompletes atomic.Int64 // calls left to fail
	failExtends   atomic.Int64
	extendsAlways atomic.Bool
	failReleases  atomic.Int64
	loseAnswers   atomic.Int64 // Completes applied whose answer is then lost
	completes     atomic.Int64 // calls seen
	extends       atomic.Int64
	releases      atomic.Int64
}

func (f *flakyStore) Release(ctx context.Context, p store.ReleaseParams) error {
	f.releases.Add(1)
	if takeFailure(&f.failReleases) {
		return errOutage
	}
	return f.Store.Release(ctx, p)
}

func takeFailure(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

func (f *flakyStore) Complete(ctx context.Context, p store.CompleteParams) error {
	f.completes.Add(1)
	if takeFailure(&f.failCompletes) {
		return errOutage
	}
	if takeFailure(&f.loseAnswers) {
		if err := f.Store.Complete(ctx, p); err != nil {
			return err
		}
		return errOutage
	}
	return f.Store.Complete(ctx, p)
}

func (f *flakyStore) Extend(ctx context.Context, p store.ExtendParams) error {
	f.extends.Add(1)
	if f.extendsAlways.Load() || takeFailure(&f.failExtends) {
		return errOutage
	}
	return f.Store.Extend(ctx, p)
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
	once.Do(func() { close(release) })
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("original: %d", w.Code)
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

// A failed renewal is retried soon, not a whole Lease/3 later: a short
// outage must not eat the lease.
func TestRenewalRetriesSoonAfterAFailure(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	s := &flakyStore{Store: memory.New(memory.Config{Clock: clk.Now})}
	e, err := idem.New(s, idem.Config{Lease: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	started, release := make(chan *idem.Execution, 1), make(chan struct{})
	h := e.Middleware(holdingHandler(started, release))
	done := make(chan struct{})
	go func() { sendKeyed(h, "k"); close(done) }()
	<-started
	s.failExtends.Store(1)
	clk.Advance(10 * time.Second)
	if n := s.extends.Load(); n != 1 {
		t.Fatalf("%d renewals at +10s, want 1", n)
	}
	clk.Advance(2 * time.Second)
	if n := s.extends.Load(); n != 2 {
		t.Fatalf("%d renewals at +12s, want 2 (the failed one retried within a thirtieth of the lease)", n)
	}
	close(release)
	<-done
}

// Every 2xx/3xx/4xx a client receives is the answer every later retry
// replays: answers are stored before they are sent, completion survives
// transient store failures, and clients racing with the same key (one
// retrying the moment it got its large answer) never see anything but
// 409 before the answer and the same answer after it. On every store.
func TestAcknowledgedAnswersAreReplayed(t *testing.T) {
	t.Parallel()
	for _, ns := range engineStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			s := &flakyStore{Store: ns.Open(t, nil)}
			e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			var executions atomic.Int64
			srv := httptest.NewServer(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := executions.Add(1)
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusCreated)
				// 900 KB, different for every execution: a second
				// execution could not pass for the first.
				fmt.Fprintf(w, "execution %d\n", n)
				w.Write(bytes.Repeat([]byte("x"), 900<<10))
			})))
			defer srv.Close()
			send := func(key string) (int, []byte) {
				req, _ := http.NewRequest("POST", srv.URL+"/v1/exports", strings.NewReader(`{"q":1}`))
				req.Header.Set("Idempotency-Key", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return 0, nil
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Error(err)
				}
				return resp.StatusCode, b
			}
			for round := range 3 {
				key := fmt.Sprintf("export-%d", round)
				// Completion fails twice and renewals once before they
				// succeed: a database blip while the answer is recorded.
				s.failCompletes.Store(2)
				s.failExtends.Store(1)
				var mu sync.Mutex
				var answers [][]byte
				var wg sync.WaitGroup
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							code, body := send(key)
							if code == http.StatusConflict {
								continue // in flight: retry, as a client would
							}
							if code != http.StatusCreated {
								t.Errorf("answer %d: %.80s", code, body)
								return
							}
							// Retry the moment the answer arrived.
							again, replayed := send(key)
							if again != http.StatusCreated || !bytes.Equal(replayed, body) {
								t.Errorf("retry right after a %d-byte answer: %d with %d bytes", len(body), again, len(replayed))
							}
							mu.Lock()
							answers = append(answers, body)
							mu.Unlock()
							return
						}
					}()
				}
				wg.Wait()
				_, final := send(key)
				for _, a := range answers {
					if !bytes.Equal(a, final) {
						t.Fatalf("a client got an answer (%.20q) that retries do not replay (%.20q)", a, final)
					}
				}
			}
			if n := executions.Load(); n != 3 {
				t.Fatalf("%d executions for 3 keys", n)
			}
			if s.completes.Load() < 9 {
				t.Fatalf("%d completion attempts, want the failed ones retried", s.completes.Load())
			}
		})
	}
}

// When the store stays down until the lease would lapse, the engine gives
// up: the client gets the answer it earned, nothing is released, and the
// record becomes unknown once its lease expires.
func TestCompletionGivesUpWhenTheLeaseWouldLapse(t *testing.T) {
	t.Parallel()
	storeClock := storetest.NewClock()
	s := &flakyStore{Store: memory.New(memory.Config{Clock: storeClock.Now})}
	s.failCompletes.Store(1 << 30)
	s.extendsAlways.Store(true)
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
	if !strings.Contains(logs.String(), "could not record the outcome before the lease would lapse") {
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
	s := &flakyStore{Store: memory.New(memory.Config{})}
	s.failReleases.Store(2)
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
	if n := s.releases.Load(); n != 3 {
		t.Fatalf("%d release attempts, want 3", n)
	}
}

// A completion applied by the store whose answer was lost (the connection
// broke after the commit) is recognised when the retry finds the record
// completed under this execution's fence: recorded, not lost.
func TestCompletionWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	s := &flakyStore{Store: memory.New(memory.Config{})}
	s.loseAnswers.Store(1)
	var logs bytes.Buffer
	e, err := idem.New(s, idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	if w := sendKeyed(h, "k"); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if w := sendKeyed(h, "k"); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "made" {
		t.Fatalf("retry: %d %q", w.Code, w.Body)
	}
	if strings.Contains(logs.String(), "no longer holds") || !strings.Contains(logs.String(), "outcome recorded after retries") {
		t.Fatalf("logs: %s", logs.String())
	}
}
