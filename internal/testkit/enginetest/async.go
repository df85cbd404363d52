package enginetest

import (
	"context"
	"errors"
	"fmt"
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
)

// AsyncApp is an API with one asynchronous route (POST /v1/reports) over
// a store, its status resources, and a worker running the same handler.
// Callers are told apart by X-Tenant.
type AsyncApp struct {
	t      *testing.T
	Eng    *idem.Engine
	Srv    *httptest.Server
	Worker *idem.Worker

	mu   sync.Mutex
	runs map[string]int         // executions per key
	seen map[string]http.Header // headers the handler saw, per key
	body map[string]string
	// block, when set, makes the handler close it, wait for its context
	// to end and answer 500 (a worker cut off mid-run).
	block chan struct{}
}

// Answer is what a client got.
type Answer struct {
	Status int
	Header http.Header
	Body   string
}

// NewAsyncApp serves the app until the test ends.
func NewAsyncApp(t *testing.T, s store.Store, cfg idem.Config) *AsyncApp {
	t.Helper()
	cfg.Async = true
	cfg.Logger = slog.New(slog.DiscardHandler)
	if cfg.Tenant == nil {
		cfg.Tenant = func(r *http.Request) string { return r.Header.Get("X-Tenant") }
	}
	eng, err := idem.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &AsyncApp{t: t, Eng: eng, runs: map[string]int{}, seen: map[string]http.Header{}, body: map[string]string{}}
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
	a.Srv = httptest.NewServer(mux)
	t.Cleanup(a.Srv.Close)
	a.Worker, err = eng.NewWorker(idem.WorkerConfig{Handler: handler})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Block makes the next execution wait for its context to end; the channel
// returned is closed once it started.
func (a *AsyncApp) Block() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.block = make(chan struct{})
	return a.block
}

// Do sends one request; hdr are name, value pairs.
func (a *AsyncApp) Do(method, path, tenant, key, body string, hdr ...string) Answer {
	a.t.Helper()
	req, err := http.NewRequest(method, a.Srv.URL+path, strings.NewReader(body))
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
	// The server's own client: a parallel test closing its server closes
	// the idle connections of http.DefaultTransport, which can break a
	// request about to reuse one.
	resp, err := a.Srv.Client().Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return Answer{resp.StatusCode, resp.Header, string(b)}
}

// Post sends a request to the asynchronous route.
func (a *AsyncApp) Post(tenant, key, body string, hdr ...string) Answer {
	a.t.Helper()
	return a.Do("POST", "/v1/reports?month=11", tenant, key, body, hdr...)
}

// Runs returns how many times the handler ran for key, and what it got
// the last time.
func (a *AsyncApp) Runs(key string) (n int, header http.Header, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[key], a.seen[key], a.body[key]
}

// WantAccepted checks a 202 with Retry-After (and Location, when given).
func WantAccepted(t *testing.T, got Answer, location string) {
	t.Helper()
	if got.Status != http.StatusAccepted || got.Header.Get("Retry-After") == "" ||
		!strings.Contains(got.Body, idem.SlugAccepted) {
		t.Fatalf("want 202 with Retry-After, got %d %v %s", got.Status, got.Header, got.Body)
	}
	if location != "" && got.Header.Get("Location") != location {
		t.Fatalf("Location %q, want %q", got.Header.Get("Location"), location)
	}
}

// AsyncFlow is the life of an asynchronous request over s: accepted,
// retried and read while pending, run once by a worker, then replayed;
// another tenant never sees it.
func AsyncFlow(t *testing.T, s store.Store) {
	a := NewAsyncApp(t, s, idem.Config{})
	first := a.Post("acme", "r1", `{"month":11}`, "Authorization", "Bearer secret", "Cookie", "s=1", "X-Trace", "t1")
	loc := first.Header.Get("Location")
	WantAccepted(t, first, "")
	if !strings.HasPrefix(loc, idem.DefaultStatusPath) || loc != a.Eng.StatusLocation("POST", "/v1/reports", "r1") {
		t.Fatalf("Location %q", loc)
	}
	if n, _, _ := a.Runs("r1"); n != 0 {
		t.Fatalf("the handler ran %d times while the client waited", n)
	}
	// Retries and status reads: 202 while pending.
	WantAccepted(t, a.Post("acme", "r1", `{"month":11}`), loc)
	WantAccepted(t, a.Do("GET", loc, "acme", "", ""), loc)
	// Another request under the key is refused, pending or not.
	if got := a.Post("acme", "r1", `{"month":12}`); got.Status != http.StatusUnprocessableEntity {
		t.Fatalf("key reused while pending: %d", got.Status)
	}
	// Another tenant never sees the request, nor learns it exists.
	if got := a.Do("GET", loc, "other", "", ""); got.Status != http.StatusNotFound || !strings.Contains(got.Body, idem.SlugRequestNotFound) {
		t.Fatalf("another tenant's status read: %d %s", got.Status, got.Body)
	}
	for _, bad := range []string{idem.DefaultStatusPath + "!!", idem.DefaultStatusPath + "cG9zdA", idem.DefaultStatusPath} {
		if got := a.Do("GET", bad, "acme", "", ""); got.Status != http.StatusNotFound {
			t.Fatalf("status read of %q: %d", bad, got.Status)
		}
	}

	n, err := a.Worker.RunOnce(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("RunOnce: %d %v", n, err)
	}
	runs, seen, body := a.Runs("r1")
	if runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
	if body != `{"month":11}` || seen.Get("X-Trace") != "t1" || seen.Get("Content-Type") != "application/json" {
		t.Fatalf("worker's request: body %q headers %v", body, seen)
	}
	if seen.Get("Authorization") != "" || seen.Get("Cookie") != "" {
		t.Fatalf("credentials were stored with the request: %v", seen)
	}
	for _, got := range []Answer{a.Post("acme", "r1", `{"month":11}`), a.Do("GET", loc, "acme", "", "")} {
		if got.Status != http.StatusCreated || got.Header.Get("Idempotent-Replayed") != "true" ||
			got.Body != `{"report":"r1","target":"/v1/reports?month=11"}` {
			t.Fatalf("answer once complete: %d %v %s", got.Status, got.Header, got.Body)
		}
	}
	if n, _ := a.Worker.RunOnce(context.Background()); n != 0 {
		t.Fatalf("a completed request was claimed again (%d)", n)
	}
	if runs, _, _ := a.Runs("r1"); runs != 1 {
		t.Fatalf("a completed request ran again (%d runs)", runs)
	}
}

// AsyncExpiry: a request no worker claims before AsyncWait ends with a
// stored 408 that retries and status reads get. clock is s's.
func AsyncExpiry(t *testing.T, s store.Store, clock interface{ Advance(time.Duration) }) {
	a := NewAsyncApp(t, s, idem.Config{AsyncWait: time.Minute})
	loc := a.Post("acme", "late", `{}`).Header.Get("Location")
	mt, err := maintenance.New(s, maintenance.Config{Logger: slog.New(slog.DiscardHandler)})
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
	if n, _ := a.Worker.RunOnce(context.Background()); n != 0 {
		t.Fatal("an expired request was claimed")
	}
	if runs, _, _ := a.Runs("late"); runs != 0 {
		t.Fatal("an expired request was run")
	}
	for _, got := range []Answer{a.Post("acme", "late", `{}`), a.Do("GET", loc, "acme", "", "")} {
		if got.Status != http.StatusRequestTimeout || !strings.Contains(got.Body, idem.SlugPendingExpired) {
			t.Fatalf("answer of an expired request: %d %s", got.Status, got.Body)
		}
	}
}

// AsyncCap: an asynchronous route holds a tenant to
// Config.TenantMaxActive, its pending requests counting as active: at the
// cap a new key gets 429 tenant-over-cap and nothing is reserved, while a
// duplicate of a pending request is still answered 202 and another tenant
// is served; once a worker completed the requests the places are free.
func AsyncCap(t *testing.T, s store.Store) {
	a := NewAsyncApp(t, s, idem.Config{TenantMaxActive: 2})
	var locs []string
	for i := range 2 {
		got := a.Post("acme", fmt.Sprint("r", i), `{}`)
		WantAccepted(t, got, "")
		locs = append(locs, got.Header.Get("Location"))
	}
	scope := (&idem.Request{Tenant: "acme", Method: "POST", Route: "/v1/reports"}).Scope()
	got := a.Post("acme", "r2", `{}`)
	if got.Status != http.StatusTooManyRequests || !strings.Contains(got.Body, idem.SlugOverCap) ||
		got.Header.Get("Retry-After") == "" || got.Header.Get("Location") != "" {
		t.Fatalf("a new key at the cap: %d %v %s", got.Status, got.Header, got.Body)
	}
	if _, err := s.Get(context.Background(), scope, "r2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a request refused at the cap left a record: %v", err)
	}
	WantAccepted(t, a.Post("acme", "r0", `{}`), locs[0])
	WantAccepted(t, a.Do("GET", locs[1], "acme", "", ""), locs[1])
	WantAccepted(t, a.Post("other", "o0", `{}`), "")
	if n, err := a.Worker.RunOnce(context.Background()); err != nil || n != 3 {
		t.Fatalf("RunOnce: %d %v", n, err)
	}
	if runs, _, _ := a.Runs("r2"); runs != 0 {
		t.Fatalf("the refused request ran %d times", runs)
	}
	WantAccepted(t, a.Post("acme", "r2", `{}`), "")
}

// AsyncRefund checks that the tenant rate counts new keys only: a retry
// that reclaims a released asynchronous request, or takes over one whose
// worker's lease ran out, takes a token and gets it back, so new keys after
// them are still admitted. Three tokens and no refill to speak of; s runs
// on clock.
func AsyncRefund(t *testing.T, s store.Store, clock interface{ Advance(time.Duration) }) {
	a := NewAsyncApp(t, s, idem.Config{TenantRate: 0.0001, TenantBurst: 3, LeasePolicy: store.LeaseRetry})
	ctx := context.Background()
	claim := func() store.Record {
		t.Helper()
		recs, err := s.(store.Queue).Claim(ctx, store.ClaimParams{Queue: idem.DefaultAsyncQueue, Limit: 1, Lease: time.Minute})
		if err != nil || len(recs) != 1 {
			t.Fatalf("claim: %v %v", recs, err)
		}
		return recs[0]
	}
	WantAccepted(t, a.Post("acme", "k1", `{}`), "") // a token
	r := claim()
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: r.Scope, Key: r.Key,
		Fence: r.Fence}, Error: "upstream refused"}); err != nil {
		t.Fatal(err)
	}
	WantAccepted(t, a.Post("acme", "k1", `{}`), "") // reclaimed: given back
	claim()                                         // k1 again, left to run
	WantAccepted(t, a.Post("acme", "k2", `{}`), "") // a token
	claim()
	clock.Advance(2 * time.Minute)                  // the worker on k2 is gone
	WantAccepted(t, a.Post("acme", "k2", `{}`), "") // taken over: given back
	WantAccepted(t, a.Post("acme", "k3", `{}`), "") // the last token
	if got := a.Post("acme", "k4", `{}`); got.Status != http.StatusTooManyRequests {
		t.Fatalf("a new key with the three tokens spent on new keys: %d %s, want 429", got.Status, got.Body)
	}
}

// claimGate holds every Claim until the test lets it go, then claims even
// if the worker's context ended meanwhile: a claim the store applied while
// the worker was being stopped, its answer arriving after.
type claimGate struct {
	store.Store
	q        store.Queue
	claiming chan struct{} // receives once a claim waits
	proceed  chan struct{}
}

func (g *claimGate) ReservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	return g.q.ReservePending(ctx, p)
}

func (g *claimGate) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	return g.q.ExpirePending(ctx, p)
}

func (g *claimGate) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	select {
	case g.claiming <- struct{}{}:
	default:
	}
	<-g.proceed
	return g.q.Claim(context.WithoutCancel(ctx), p)
}

// AsyncStopWhileClaiming checks a worker stopped while it claims, over s
// (a store that keeps pending requests): the request the claim returns
// never started, so it is neither run with a context already ended (its
// outcome would be unknown), nor left in progress for its lease to lapse,
// nor released for the client to send again, which was told it was
// accepted: it goes back to the queue, its status still says accepted, and
// the next worker runs it, with the request as it was accepted.
func AsyncStopWhileClaiming(t *testing.T, s store.Store) {
	q, why := store.AsQueue(s)
	if why != "" {
		t.Fatal(why)
	}
	g := &claimGate{Store: s, q: q, claiming: make(chan struct{}, 1), proceed: make(chan struct{})}
	a := NewAsyncApp(t, g, idem.Config{})
	loc := a.Post("acme", "k", `{"n":1}`).Header.Get("Location")
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Worker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-g.claiming
	cancel()
	close(g.proceed)
	if err := a.Worker.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	scope := (&idem.Request{Tenant: "acme", Method: "POST", Route: "/v1/reports"}).Scope()
	rec, err := s.Get(context.Background(), scope, "k")
	if runs, _, _ := a.Runs("k"); runs != 0 || err != nil || rec.State != store.StatePending {
		t.Fatalf("a request claimed as the worker stopped: ran %d times, record %s %v; want no run, pending", runs, rec.State, err)
	}
	// Back in the queue with AsyncWait (1h by default) to be claimed in,
	// not a worker's lease: it must not expire as unclaimed (408) while
	// the workers restart.
	if wait := time.Until(rec.LockedUntil); wait < 50*time.Minute {
		t.Fatalf("the requeued request must be claimed within %v; want about AsyncWait, 1h", wait)
	}
	WantAccepted(t, a.Do("GET", loc, "acme", "", ""), "")
	if n, err := a.Worker.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("the next worker's claim: %d requests, %v; want the one back in the queue", n, err)
	}
	if runs, _, body := a.Runs("k"); runs != 1 || body != `{"n":1}` {
		t.Fatalf("after the next worker: ran %d times with body %q", runs, body)
	}
	if got := a.Do("GET", loc, "acme", "", ""); got.Status != http.StatusCreated {
		t.Fatalf("status after the run: %d %s", got.Status, got.Body)
	}
}
