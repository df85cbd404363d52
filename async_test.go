package idem_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

var quietLog = slog.New(slog.DiscardHandler)

// asyncApp is an API with one asynchronous route over a store, its status
// resources, and a worker running the same handler.
type asyncApp struct {
	t      *testing.T
	eng    *idem.Engine
	srv    *httptest.Server
	worker *idem.Worker

	mu   sync.Mutex
	runs map[string]int         // executions per key
	seen map[string]http.Header // headers the handler saw, per key
	body map[string]string
	// block, when set, makes the handler wait for its context to end and
	// answer 500 (a worker cut off mid-run).
	block chan struct{}
}

func newAsyncApp(t *testing.T, s store.Store, cfg idem.Config) *asyncApp {
	t.Helper()
	cfg.Async = true
	cfg.Logger = quietLog
	if cfg.Tenant == nil {
		cfg.Tenant = func(r *http.Request) string { return r.Header.Get("X-Tenant") }
	}
	eng, err := idem.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &asyncApp{t: t, eng: eng, runs: map[string]int{}, seen: map[string]http.Header{}, body: map[string]string{}}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := idem.FromContext(r.Context())
		if x == nil {
			http.Error(w, "no execution", 500)
			return
		}
		b, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.runs[x.Key()]++
		a.seen[x.Key()] = r.Header.Clone()
		a.body[x.Key()] = string(b)
		block := a.block
		a.mu.Unlock()
		if block != nil {
			close(block)
			<-r.Context().Done()
			http.Error(w, "cut off", http.StatusInternalServerError)
			return
		}
		if strings.Contains(string(b), "panic") {
			panic("handler bug")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"report":"`+x.Key()+`","target":"`+r.URL.RequestURI()+`"}`)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/reports", eng.Middleware(handler))
	mux.Handle("GET "+idem.DefaultStatusPath, eng.StatusHandler())
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	a.worker, err = eng.NewWorker(idem.WorkerConfig{Handler: handler})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (a *asyncApp) do(method, path, tenant, key, body string, hdr ...string) answer {
	a.t.Helper()
	req, err := http.NewRequest(method, a.srv.URL+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("X-Tenant", tenant)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func (a *asyncApp) post(tenant, key, body string, hdr ...string) answer {
	a.t.Helper()
	return a.do("POST", "/v1/reports?month=11", tenant, key, body, hdr...)
}

func (a *asyncApp) runs0(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[key]
}

func wantAccepted(t *testing.T, got answer, location string) {
	t.Helper()
	if got.status != http.StatusAccepted || got.header.Get("Retry-After") == "" ||
		!strings.Contains(got.body, idem.SlugAccepted) {
		t.Fatalf("want 202 with Retry-After, got %d %v %s", got.status, got.header, got.body)
	}
	if location != "" && got.header.Get("Location") != location {
		t.Fatalf("Location %q, want %q", got.header.Get("Location"), location)
	}
}

func TestAsyncAcceptRunReplay(t *testing.T) { asyncFlow(t, memory.New(memory.Config{})) }

// asyncFlow is the life of an asynchronous request over s: accepted,
// retried and read while pending, run once by a worker, then replayed.
func asyncFlow(t *testing.T, s store.Store) {
	a := newAsyncApp(t, s, idem.Config{})
	first := a.post("acme", "r1", `{"month":11}`, "Authorization", "Bearer secret", "Cookie", "s=1", "X-Trace", "t1")
	loc := first.header.Get("Location")
	wantAccepted(t, first, "")
	if !strings.HasPrefix(loc, idem.DefaultStatusPath) || loc != a.eng.StatusLocation("POST", "/v1/reports", "r1") {
		t.Fatalf("Location %q", loc)
	}
	if n := a.runs0("r1"); n != 0 {
		t.Fatalf("the handler ran %d times while the client waited", n)
	}
	// Retries and status reads: 202 while pending.
	wantAccepted(t, a.post("acme", "r1", `{"month":11}`), loc)
	wantAccepted(t, a.do("GET", loc, "acme", "", ""), loc)
	// Another request under the key is refused, pending or not.
	if got := a.post("acme", "r1", `{"month":12}`); got.status != http.StatusUnprocessableEntity {
		t.Fatalf("key reused while pending: %d", got.status)
	}
	// Another tenant never sees the request, nor learns it exists.
	if got := a.do("GET", loc, "other", "", ""); got.status != http.StatusNotFound || !strings.Contains(got.body, idem.SlugRequestNotFound) {
		t.Fatalf("another tenant's status read: %d %s", got.status, got.body)
	}
	for _, bad := range []string{idem.DefaultStatusPath + "!!", idem.DefaultStatusPath + "cG9zdA", idem.DefaultStatusPath} {
		if got := a.do("GET", bad, "acme", "", ""); got.status != http.StatusNotFound {
			t.Fatalf("status read of %q: %d", bad, got.status)
		}
	}

	n, err := a.worker.RunOnce(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("RunOnce: %d %v", n, err)
	}
	if n := a.runs0("r1"); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	a.mu.Lock()
	seen, body := a.seen["r1"], a.body["r1"]
	a.mu.Unlock()
	if body != `{"month":11}` || seen.Get("X-Trace") != "t1" || seen.Get("Content-Type") != "application/json" {
		t.Fatalf("worker's request: body %q headers %v", body, seen)
	}
	if seen.Get("Authorization") != "" || seen.Get("Cookie") != "" {
		t.Fatalf("credentials were stored with the request: %v", seen)
	}
	for _, got := range []answer{a.post("acme", "r1", `{"month":11}`), a.do("GET", loc, "acme", "", "")} {
		if got.status != http.StatusCreated || got.header.Get("Idempotent-Replayed") != "true" ||
			got.body != `{"report":"r1","target":"/v1/reports?month=11"}` {
			t.Fatalf("answer once complete: %d %v %s", got.status, got.header, got.body)
		}
	}
	if n, _ := a.worker.RunOnce(context.Background()); n != 0 || a.runs0("r1") != 1 {
		t.Fatalf("a completed request ran again (claimed %d, runs %d)", n, a.runs0("r1"))
	}
	if got := a.do("POST", idem.DefaultStatusPath+"x", "acme", "", ""); got.status != http.StatusMethodNotAllowed && got.status != http.StatusNotFound {
		t.Fatalf("POST on a status resource: %d", got.status)
	}
}

func TestAsyncKeepHeaders(t *testing.T) {
	a := newAsyncApp(t, memory.New(memory.Config{}), idem.Config{AsyncKeepHeaders: []string{"authorization"}})
	a.post("acme", "k", `{}`, "Authorization", "Bearer worker", "Cookie", "s=1", "Connection", "X-Hop", "X-Hop", "1")
	if _, err := a.worker.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	seen := a.seen["k"]
	a.mu.Unlock()
	if seen.Get("Authorization") != "Bearer worker" || seen.Get("Cookie") != "" || seen.Get("X-Hop") != "" {
		t.Fatalf("kept headers: %v", seen)
	}
}

func TestAsyncExpiresUnclaimed(t *testing.T) {
	clock := storetest.NewClock()
	asyncExpiry(t, memory.New(memory.Config{Clock: clock.Now}), clock)
}

// asyncExpiry: a request no worker claims before AsyncWait ends with a
// stored 408 that retries and status reads get.
func asyncExpiry(t *testing.T, s store.Store, clock *storetest.Clock) {
	a := newAsyncApp(t, s, idem.Config{AsyncWait: time.Minute})
	loc := a.post("acme", "late", `{}`).header.Get("Location")
	mt, err := maintenance.New(s, maintenance.Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := mt.ExpirePendingOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("expiry before the deadline: %d %v", n, err)
	}
	clock.Advance(time.Minute)
	if n, err := mt.ExpirePendingOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("expiry past the deadline: %d %v", n, err)
	}
	if n, _ := a.worker.RunOnce(context.Background()); n != 0 || a.runs0("late") != 0 {
		t.Fatal("an expired request was run")
	}
	for _, got := range []answer{a.post("acme", "late", `{}`), a.do("GET", loc, "acme", "", "")} {
		if got.status != http.StatusRequestTimeout || !strings.Contains(got.body, idem.SlugPendingExpired) {
			t.Fatalf("answer of an expired request: %d %s", got.status, got.body)
		}
	}
}

func TestAsyncWorkerSurvivesPanic(t *testing.T) {
	s := memory.New(memory.Config{})
	a := newAsyncApp(t, s, idem.Config{})
	a.post("acme", "boom", `{"x":"panic"}`)
	a.post("acme", "fine", `{"x":1}`)
	if n, err := a.worker.RunOnce(context.Background()); err != nil || n != 2 {
		t.Fatalf("RunOnce: %d %v", n, err)
	}
	if got := a.post("acme", "boom", `{"x":"panic"}`); got.status != http.StatusConflict || !strings.Contains(got.body, idem.SlugOutcomeUnknown) {
		t.Fatalf("after a panic: %d %s", got.status, got.body)
	}
	if got := a.post("acme", "fine", `{"x":1}`); got.status != http.StatusCreated {
		t.Fatalf("the other request: %d %s", got.status, got.body)
	}
}

// A worker stopped while it runs a request: the handler sees its context
// end; what it answers then is recorded as unknown (it may have had its
// effect), never run again by another worker.
func TestAsyncWorkerStopped(t *testing.T) {
	s := memory.New(memory.Config{})
	a := newAsyncApp(t, s, idem.Config{})
	a.block = make(chan struct{})
	started := a.block
	a.post("acme", "long", `{}`)
	if err := a.worker.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := a.worker.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(context.Background(), (&idem.Request{Tenant: "acme", Method: "POST", Route: "/v1/reports"}).Scope(), "long")
	if err != nil || rec.State != store.StateUnknown || rec.Attempts != 1 {
		t.Fatalf("record of the cut-off request: %s attempts %d %v", rec.State, rec.Attempts, err)
	}
	if n, _ := a.worker.RunOnce(context.Background()); n != 0 || a.runs0("long") != 1 {
		t.Fatal("the cut-off request ran again")
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
