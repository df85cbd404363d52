package idem_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

// The asynchronous mode on the memory store; the integration module runs
// enginetest.AsyncFlow and AsyncExpiry on the other stores.

func TestAsyncAcceptRunReplay(t *testing.T) { enginetest.AsyncFlow(t, memory.New(memory.Config{})) }

func TestAsyncExpiresUnclaimed(t *testing.T) {
	clock := storetest.NewClock()
	enginetest.AsyncExpiry(t, memory.New(memory.Config{Clock: clock.Now}), clock)
}

func TestAsyncTenantCap(t *testing.T) { enginetest.AsyncCap(t, memory.New(memory.Config{})) }

func TestAsyncTenantRateRefund(t *testing.T) {
	clock := storetest.NewClock()
	enginetest.AsyncRefund(t, memory.New(memory.Config{Clock: clock.Now}), clock)
}

func TestAsyncKeepHeaders(t *testing.T) {
	a := enginetest.NewAsyncApp(t, memory.New(memory.Config{}), idem.Config{AsyncKeepHeaders: []string{"authorization"}})
	a.Post("acme", "k", `{}`, "Authorization", "Bearer worker", "Cookie", "s=1", "Connection", "X-Hop", "X-Hop", "1")
	if _, err := a.Worker.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, seen, _ := a.Runs("k")
	if seen.Get("Authorization") != "Bearer worker" || seen.Get("Cookie") != "" || seen.Get("X-Hop") != "" {
		t.Fatalf("kept headers: %v", seen)
	}
}

func TestAsyncWorkerSurvivesPanic(t *testing.T) {
	a := enginetest.NewAsyncApp(t, memory.New(memory.Config{}), idem.Config{})
	a.Post("acme", "boom", `{"x":"panic"}`)
	a.Post("acme", "fine", `{"x":1}`)
	if n, err := a.Worker.RunOnce(context.Background()); err != nil || n != 2 {
		t.Fatalf("RunOnce: %d %v", n, err)
	}
	if got := a.Post("acme", "boom", `{"x":"panic"}`); got.Status != http.StatusConflict || !strings.Contains(got.Body, idem.SlugOutcomeUnknown) {
		t.Fatalf("after a panic: %d %s", got.Status, got.Body)
	}
	if got := a.Post("acme", "fine", `{"x":1}`); got.Status != http.StatusCreated {
		t.Fatalf("the other request: %d %s", got.Status, got.Body)
	}
}

// A worker stopped while it runs a request: the handler sees its context
// end; what it answers then is recorded as unknown (it may have had its
// effect), never run again by another worker.
func TestAsyncWorkerStopped(t *testing.T) {
	s := memory.New(memory.Config{})
	a := enginetest.NewAsyncApp(t, s, idem.Config{})
	started := a.Block()
	a.Post("acme", "long", `{}`)
	if err := a.Worker.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := a.Worker.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(context.Background(), (&idem.Request{Tenant: "acme", Method: "POST", Route: "/v1/reports"}).Scope(), "long")
	if err != nil || rec.State != store.StateUnknown || rec.Attempts != 1 {
		t.Fatalf("record of the cut-off request: %s attempts %d %v", rec.State, rec.Attempts, err)
	}
	if n, _ := a.Worker.RunOnce(context.Background()); n != 0 {
		t.Fatal("the cut-off request was claimed again")
	}
	if runs, _, _ := a.Runs("long"); runs != 1 {
		t.Fatalf("the cut-off request ran %d times", runs)
	}
}

func TestAsyncConfig(t *testing.T) {
	s := memory.New(memory.Config{})
	for name, cfg := range map[string]idem.Config{
		"wait beyond ttl": {Async: true, TTL: time.Hour, AsyncWait: 2 * time.Hour},
		"negative wait":   {Async: true, AsyncWait: -time.Second},
		"status path":     {Async: true, StatusPath: "status"},
		"keep header":     {Async: true, AsyncKeepHeaders: []string{"Bad Name"}},
		"queue":           {Async: true, AsyncQueue: "a\nb"},
	} {
		if _, err := idem.New(s, cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := idem.New(noQueue{s}, idem.Config{Async: true}); err == nil || !strings.Contains(err.Error(), "store.Queue") {
		t.Fatalf("Async over a store without a queue: %v", err)
	}
	eng, err := idem.New(noQueue{s}, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.With(func(c *idem.Config) { c.Async = true }); err == nil {
		t.Fatal("With(Async) over a store without a queue: no error")
	}
	if _, err := eng.NewWorker(idem.WorkerConfig{Handler: http.NotFoundHandler()}); err == nil {
		t.Fatal("NewWorker over a store without a queue: no error")
	}
	eng, _ = idem.New(s, idem.Config{})
	if _, err := eng.NewWorker(idem.WorkerConfig{}); err == nil {
		t.Fatal("NewWorker without a handler: no error")
	}
	if _, err := eng.NewWorker(idem.WorkerConfig{Handler: http.NotFoundHandler(), Concurrency: -1}); err == nil {
		t.Fatal("NewWorker with a negative concurrency: no error")
	}
}

// noQueue hides a store's queue.
type noQueue struct{ store.Store }

// partialClaim claims as the memory store does, then reports a failure
// with what it claimed: a store whose claim runs in several steps (a
// cluster's masters), one of which failed.
type partialClaim struct{ *memory.Store }

var errStep = errors.New("one master timed out")

func (p partialClaim) Claim(ctx context.Context, c store.ClaimParams) ([]store.Record, error) {
	recs, err := p.Store.Claim(ctx, c)
	if err != nil {
		return nil, err
	}
	return recs, errStep
}

// A worker runs the records a claim returns with its failure: they are in
// progress under its fence, and nobody else would run them.
func TestAsyncWorkerRunsWhatAFailedClaimReturned(t *testing.T) {
	a := enginetest.NewAsyncApp(t, partialClaim{memory.New(memory.Config{})}, idem.Config{})
	a.Post("acme", "k", `{"x":1}`)
	n, err := a.Worker.RunOnce(context.Background())
	if n != 1 || !errors.Is(err, errStep) {
		t.Fatalf("RunOnce: %d %v, want the claimed request run and the failure reported", n, err)
	}
	if runs, _, _ := a.Runs("k"); runs != 1 {
		t.Fatalf("the claimed request ran %d times", runs)
	}
}

// An asynchronous request whose worker died, under LeasePolicy retry: no
// worker claims it again and the sweeper leaves it alone, so its status
// resource says so (request-interrupted) instead of "will be processed";
// a retry with the key queues it again, and a worker runs it.
func TestAsyncStatusOfADeadWorkersRequest(t *testing.T) {
	clk := newStepClock()
	s := memory.New(memory.Config{Clock: clk.Now})
	e, err := idem.New(s, idem.Config{Async: true, LeasePolicy: store.LeaseRetry, Lease: time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	h := e.Middleware(http.NotFoundHandler())
	w := sendKeyed(h, "k")
	loc := w.Header().Get("Location")
	if w.Code != http.StatusAccepted || loc == "" {
		t.Fatalf("accept: %d", w.Code)
	}
	var runs atomic.Int64
	wk, err := e.NewWorker(idem.WorkerConfig{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			idem.FromContext(r.Context()).Abandon() // the worker's process dies here
			return
		}
		w.WriteHeader(http.StatusCreated)
	})})
	if err != nil {
		t.Fatal(err)
	}
	status := func() *httptest.ResponseRecorder {
		st := httptest.NewRecorder()
		e.StatusHandler().ServeHTTP(st, httptest.NewRequest("GET", loc, nil))
		return st
	}
	if n, err := wk.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("RunOnce %d %v", n, err)
	}
	if st := status(); st.Code != http.StatusAccepted {
		t.Fatalf("status while the lease holds: %d %s", st.Code, st.Body)
	}
	clk.Advance(time.Hour)
	if n, _ := wk.RunOnce(context.Background()); n != 0 {
		t.Fatalf("claimed again: %d", n)
	}
	if st := status(); st.Code != http.StatusConflict || !strings.Contains(st.Body.String(), idem.SlugInterrupted) {
		t.Fatalf("status of a request nobody will run: %d %s", st.Code, st.Body)
	}
	if w := sendKeyed(h, "k"); w.Code != http.StatusAccepted {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
	if n, err := wk.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("RunOnce after the retry: %d %v", n, err)
	}
	if st := status(); st.Code != http.StatusCreated {
		t.Fatalf("status after the second run: %d %s", st.Code, st.Body)
	}
}

// Starting a running worker does nothing: one Stop stops it, and nothing
// claims requests afterwards.
func TestAsyncWorkerStartedTwice(t *testing.T) {
	a := enginetest.NewAsyncApp(t, memory.New(memory.Config{}), idem.Config{})
	for range 2 {
		if err := a.Worker.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Worker.Stop(ctx); err != nil {
		t.Fatalf("Stop after two Starts: %v (a loop outlived it)", err)
	}
	a.Post("acme", "after-stop", `{}`)
	time.Sleep(4 * idem.DefaultWorkerPoll)
	if runs, _, _ := a.Runs("after-stop"); runs != 0 {
		t.Fatalf("a request accepted after Stop ran %d times: a worker loop outlived Stop", runs)
	}
}

// A worker sleeps Poll only when the queue was empty: a backlog runs
// back to back, here with a Poll of an hour.
func TestAsyncWorkerDrainsABacklogWithoutPolling(t *testing.T) {
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Async: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	w, err := e.NewWorker(idem.WorkerConfig{Poll: time.Hour, Concurrency: 2, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	})})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.NotFoundHandler())
	const backlog = 10
	for i := range backlog {
		r := httptest.NewRequest("POST", "/v1/reports", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", fmt.Sprintf(`"b-%d"`, i))
		rec := httptest.NewRecorder()
		if h.ServeHTTP(rec, r); rec.Code != http.StatusAccepted {
			t.Fatalf("POST %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	for deadline := time.Now().Add(10 * time.Second); ran.Load() < backlog; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of a backlog of %d ran: the worker waited Poll between requests", ran.Load(), backlog)
		}
	}
}

// RunOnce with an ended context claims nothing: the requests stay
// pending for the next worker, their AsyncWait untouched.
func TestAsyncRunOnceAfterItsContextEnded(t *testing.T) {
	a := enginetest.NewAsyncApp(t, memory.New(memory.Config{}), idem.Config{})
	a.Post("acme", "k", `{}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := a.Worker.RunOnce(ctx); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("RunOnce with an ended context: %d, %v; want 0, context.Canceled", n, err)
	}
	if n, err := a.Worker.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("the next RunOnce: %d %v; want the request", n, err)
	}
}

// ParseStatusID reads back what StatusLocation wrote, and refuses an id
// without a key or that is not one.
func TestParseStatusID(t *testing.T) {
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Async: true})
	if err != nil {
		t.Fatal(err)
	}
	loc := e.StatusLocation("POST", "/v1/reports", "k-1")
	m, route, key, ok := idem.ParseStatusID(strings.TrimPrefix(loc, idem.DefaultStatusPath))
	if !ok || m != "POST" || route != "/v1/reports" || key != "k-1" {
		t.Fatalf("ParseStatusID(%q) = %q %q %q %v", loc, m, route, key, ok)
	}
	for _, id := range []string{
		strings.TrimPrefix(e.StatusLocation("POST", "/v1/reports", ""), idem.DefaultStatusPath),
		"not base64!", "", base64.RawURLEncoding.EncodeToString([]byte("POST /v1/reports")),
	} {
		if _, _, _, ok := idem.ParseStatusID(id); ok {
			t.Errorf("ParseStatusID(%q) accepted", id)
		}
	}
}

// A request whose handler failed without effect (a 503, released): its
// status says so (409 request-failed), and a retry of it queues it again.
func TestAsyncStatusOfAFailedRequest(t *testing.T) {
	s := memory.New(memory.Config{})
	e, err := idem.New(s, idem.Config{Async: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	w, err := e.NewWorker(idem.WorkerConfig{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "downstream unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.NotFoundHandler())
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/reports", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", `"r-1"`)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	first := post()
	if first.Code != http.StatusAccepted {
		t.Fatalf("POST: %d %s", first.Code, first.Body)
	}
	head := httptest.NewRecorder()
	e.StatusHandler().ServeHTTP(head, httptest.NewRequest("HEAD", first.Header().Get("Location"), nil))
	if head.Code != http.StatusAccepted {
		t.Fatalf("HEAD of the status of a pending request: %d, want 202 as GET", head.Code)
	}
	if n, err := w.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("RunOnce: %d %v", n, err)
	}
	status := httptest.NewRecorder()
	e.StatusHandler().ServeHTTP(status, httptest.NewRequest("GET", first.Header().Get("Location"), nil))
	if status.Code != http.StatusConflict || !strings.Contains(status.Body.String(), idem.SlugRequestFailed) {
		t.Fatalf("status of a failed request: %d %s; want 409 %s", status.Code, status.Body, idem.SlugRequestFailed)
	}
	down.Store(false)
	if got := post(); got.Code != http.StatusAccepted {
		t.Fatalf("retry of a failed request: %d %s; want 202, queued again", got.Code, got.Body)
	}
	if n, err := w.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("RunOnce after the retry: %d %v", n, err)
	}
}

// A worker stopped while it claims: the request goes back to the queue
// (enginetest.AsyncStopWhileClaiming; the integration module runs it on
// the other stores).
func TestAsyncWorkerStoppedWhileClaiming(t *testing.T) {
	enginetest.AsyncStopWhileClaiming(t, memory.New(memory.Config{}))
}

// Engine.Run takes its header as the caller spells it: credentials kept
// out of the store, and the headers AsyncDropHeaders and AsyncKeepHeaders
// name, are recognised in any spelling (a queue consumer or an RPC layer
// may lower-case them; "authorization" used to be stored with the request).
func TestAsyncHeaderNamesInAnySpelling(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, err := idem.New(s, idem.Config{Async: true, Logger: slog.New(slog.DiscardHandler),
		AsyncDropHeaders: []string{"X-Api-Key"}, AsyncKeepHeaders: []string{"Cookie"}})
	if err != nil {
		t.Fatal(err)
	}
	c := idem.Call{Tenant: "acme", Method: "POST", Route: "/v1/reports", Target: "/v1/reports",
		Keys: []string{"k"}, ContentType: "application/json", Body: []byte(`{}`),
		Header: map[string][]string{"authorization": {"Bearer secret"}, "PROXY-AUTHORIZATION": {"Basic x"},
			"x-api-key": {"key"}, "cookie": {"s=1"}, "x-trace": {"t"}}}
	if a := e.Run(context.Background(), c, func(context.Context) idem.Result { return idem.Result{} }); a.Verdict != idem.Accepted {
		t.Fatalf("verdict %v, want Accepted", a.Verdict)
	}
	rec, err := s.Get(context.Background(), (&idem.Request{Tenant: "acme", Method: "POST", Route: "/v1/reports"}).Scope(), "k")
	if err != nil || rec.Request == nil {
		t.Fatalf("pending record: %+v %v", rec, err)
	}
	h := rec.Request.Header
	for name := range h {
		switch http.CanonicalHeaderKey(name) {
		case "Authorization", "Proxy-Authorization", "X-Api-Key":
			t.Errorf("stored %s: %q", name, h[name])
		}
	}
	if got := h.Get("Cookie"); got != "s=1" {
		t.Errorf("Cookie, named by AsyncKeepHeaders: %q kept, want s=1 (%v)", got, h)
	}
	if got := h.Values("X-Trace"); len(got) != 1 {
		t.Errorf("X-Trace not kept: %v", h)
	}
}
