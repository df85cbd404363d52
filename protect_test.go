package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// tenantEnv serves POST /v1/charges for the tenant named in X-Tenant.
type tenantEnv struct {
	t    *testing.T
	clk  *stepClock
	st   *memory.Store
	h    http.Handler
	obs  *obstest.Recorder
	mu   sync.Mutex
	runs int
	// hold, when set, keeps the handlers of keys starting with "held"
	// running until it is closed.
	hold chan struct{}
}

func newTenantEnv(t *testing.T, cfg idem.Config) *tenantEnv {
	t.Helper()
	clk := newStepClock()
	te := &tenantEnv{t: t, clk: clk, st: memory.New(memory.Config{Clock: clk.Now}), obs: &obstest.Recorder{}}
	cfg.Tenant = func(r *http.Request) string { return r.Header.Get("X-Tenant") }
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Observer = te.obs
	e, err := idem.New(te.st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	te.h = e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		te.mu.Lock()
		te.runs++
		hold := te.hold
		te.mu.Unlock()
		if hold != nil && strings.HasPrefix(r.Header.Get("Idempotency-Key"), "held") {
			<-hold
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"ok":true}`))
	}))
	return te
}

func (te *tenantEnv) send(tenant, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-Tenant", tenant)
	w := httptest.NewRecorder()
	te.h.ServeHTTP(w, r)
	return w
}

func (te *tenantEnv) want(tenant, key string, status int) *httptest.ResponseRecorder {
	te.t.Helper()
	w := te.send(tenant, key)
	if w.Code != status {
		te.t.Fatalf("%s/%s: %d %s, want %d", tenant, key, w.Code, w.Body, status)
	}
	return w
}

// wantLimited checks a 429 of the given problem type with Retry-After, and
// that the key has no record.
func (te *tenantEnv) wantLimited(tenant, key, slug, retryAfter string) {
	te.t.Helper()
	te.wantRefused(tenant, key, 429, slug, retryAfter)
}

// wantRefused checks a refusal of the given status and problem type with
// Retry-After, and that the key has no record.
func (te *tenantEnv) wantRefused(tenant, key string, status int, slug, retryAfter string) {
	te.t.Helper()
	w := te.want(tenant, key, status)
	var doc struct{ Type string }
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || doc.Type != idem.ProblemBase+slug {
		te.t.Fatalf("%d body %s, want problem %s", status, w.Body, slug)
	}
	if ra := w.Header().Get("Retry-After"); ra != retryAfter {
		te.t.Fatalf("Retry-After %q, want %q", ra, retryAfter)
	}
	req := idem.Request{Tenant: tenant, Method: "POST", Route: "/v1/charges"}
	if _, err := te.st.Get(context.Background(), req.Scope(), key); !errors.Is(err, store.ErrNotFound) {
		te.t.Fatalf("a refused call left a record: %v", err)
	}
}

func (te *tenantEnv) ran() int {
	te.mu.Lock()
	defer te.mu.Unlock()
	return te.runs
}

// holdRequests sends a request for each tenant, key pair (keys starting
// with "held"), one after the other once the previous one runs, and
// returns when all of them hold their keys. release lets them finish and
// fails the test unless each was answered 201.
func (te *tenantEnv) holdRequests(pairs ...[2]string) (release func()) {
	te.t.Helper()
	te.mu.Lock()
	te.hold = make(chan struct{})
	base := te.runs
	te.mu.Unlock()
	codes := make([]int, len(pairs))
	var wg sync.WaitGroup
	for i, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = te.send(p[0], p[1]).Code
		}()
		for te.ran() < base+i+1 {
			time.Sleep(time.Millisecond) // until the request holds its key
		}
	}
	return func() {
		te.t.Helper()
		close(te.hold)
		wg.Wait()
		for i, code := range codes {
			if code != http.StatusCreated {
				te.t.Fatalf("held request %v: %d", pairs[i], code)
			}
		}
	}
}

// The rate of new keys: a bucket of TenantBurst refilled at TenantRate a
// second, per tenant; replays, duplicates and key reuse are not charged.
func TestTenantRate(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{TenantRate: 0.5, TenantBurst: 2})
	te.want("a", "k1", 201)
	te.want("a", "k2", 201)
	te.wantLimited("a", "k3", idem.SlugRateLimited, "2")
	if te.ran() != 2 {
		t.Fatalf("handler ran %d times, want 2", te.ran())
	}
	// Not charged: replays and a reused key are answered from the record.
	for range 5 {
		if w := te.want("a", "k1", 201); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatal("a replay under the rate limit was not replayed")
		}
	}
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":2}`))
	r.Header.Set("Idempotency-Key", "k1")
	r.Header.Set("X-Tenant", "a")
	w := httptest.NewRecorder()
	te.h.ServeHTTP(w, r)
	if w.Code != 422 {
		t.Fatalf("key reuse under the rate limit: %d, want 422", w.Code)
	}
	// Another tenant has its own bucket.
	te.want("b", "k1", 201)
	// One token every two seconds.
	te.clk.Advance(time.Second)
	te.wantLimited("a", "k3", idem.SlugRateLimited, "1")
	te.clk.Advance(time.Second)
	te.want("a", "k3", 201)
	te.wantLimited("a", "k4", idem.SlugRateLimited, "2")
	if got := te.obs.Tenants()["a/rate_limited"]; got != 3 {
		t.Fatalf("rate_limited for tenant a = %d, want 3", got)
	}
	if got := te.obs.Tenants()["a/replay"]; got != 5 {
		t.Fatalf("replay for tenant a = %d, want 5", got)
	}
	if got := te.obs.Tenants()["a/key_reused"]; got != 1 {
		t.Fatalf("key_reused for tenant a = %d, want 1", got)
	}
}

// A call that does not create a key gives its token back: an in-flight
// duplicate, reaching the store while tokens are left, costs nothing.
func TestTenantRateRefundsDuplicates(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{TenantRate: 0.001, TenantBurst: 2})
	release := te.holdRequests([2]string{"a", "held"})
	for range 5 {
		te.want("a", "held", 409)
	}
	if got := te.obs.Tenants()["a/in_progress"]; got != 5 {
		t.Fatalf("in_progress for tenant a = %d, want 5", got)
	}
	te.want("a", "second", 201) // the second token is still there
	te.wantLimited("a", "third", idem.SlugRateLimited, "1000")
	release()
}

// The cap on active records: a tenant holding TenantMaxActive requests in
// progress gets 429 for a new key, nothing reserved and nothing run, while
// its duplicates and other tenants are answered as usual.
func TestTenantMaxActive(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{TenantMaxActive: 2, RetryAfter: 3 * time.Second})
	release := te.holdRequests([2]string{"a", "held-0"}, [2]string{"a", "held-1"})
	te.wantLimited("a", "third", idem.SlugOverCap, "3")
	if got := te.obs.StoreCalls()["get"]; got != 0 {
		t.Fatalf("%d reads after a refusal at the cap, want 0: the store answered, nothing was lost", got)
	}
	te.want("a", "held-0", 409) // an in-flight duplicate is still answered
	if te.ran() != 2 {
		t.Fatalf("handler ran %d times, want 2", te.ran())
	}
	release()
	te.want("b", "other", 201)
	te.want("a", "third", 201) // the completions freed the places
	if got := te.obs.Tenants()["a/over_cap"]; got != 1 {
		t.Fatalf("over_cap for tenant a = %d, want 1", got)
	}
}

// On an asynchronous route pending requests count: at the cap a new key
// gets 429 and is not accepted, a duplicate is still accepted, and the
// tenant's outcomes are reported as on a synchronous route.
func TestTenantMaxActiveAsync(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{Async: true, TenantMaxActive: 2, RetryAfter: 3 * time.Second})
	te.want("a", "k0", 202)
	te.want("a", "k1", 202)
	te.wantLimited("a", "k2", idem.SlugOverCap, "3")
	te.want("a", "k0", 202)
	te.want("b", "k2", 202)
	if te.ran() != 0 {
		t.Fatalf("handler ran %d times on an asynchronous route", te.ran())
	}
	for k, want := range map[string]int64{"a/accepted": 2, "a/over_cap": 1, "b/accepted": 1} {
		if got := te.obs.Tenants()[k]; got != want {
			t.Fatalf("%s = %d, want %d", k, got, want)
		}
	}
}

func TestTenantLimitConfigErrors(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idem.Config{
		"negative rate":       {TenantRate: -1},
		"negative burst":      {TenantRate: 1, TenantBurst: -1},
		"negative max active": {TenantMaxActive: -1},
	} {
		if _, err := idem.New(memory.New(memory.Config{}), cfg); err == nil || !strings.Contains(err.Error(), "Tenant") {
			t.Errorf("%s: %v, want an error naming the field", name, err)
		}
	}
}

// Derived engines keep the cap and can set their own rate.
func TestTenantLimitsWith(t *testing.T) {
	t.Parallel()
	st := memory.New(memory.Config{})
	e, err := idem.New(st, idem.Config{TenantRate: 1, TenantBurst: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	clk := newStepClock()
	idem.SetClock(e, clk)
	loose, err := e.With(func(c *idem.Config) { c.TenantRate, c.TenantBurst = 100, 100 })
	if err != nil {
		t.Fatal(err)
	}
	run := func(e *idem.Engine, key string) idem.Verdict {
		return e.Run(context.Background(), idem.Call{Tenant: "a", Method: "POST", Route: "/x", Keys: []string{key}},
			func(context.Context) idem.Result { return idem.Result{Response: store.Response{Status: 201}} }).Verdict
	}
	if v := run(e, "1"); v != idem.Executed {
		t.Fatal(v)
	}
	if v := run(e, "2"); v != idem.Limited {
		t.Fatalf("second key at a rate of 1: %v, want limited", v)
	}
	for i := range 10 {
		if v := run(loose, fmt.Sprint("loose-", i)); v != idem.Executed {
			t.Fatalf("derived engine with its own rate: %v", v)
		}
	}
}

// capRefusing is a store that cannot count a tenant's records.
type capRefusing struct{ *memory.Store }

func (capRefusing) TenantCapUnsupported() string { return "no count here" }

// A cap over a store that cannot enforce it fails at New and With.
func TestTenantMaxActiveNeedsAStoreThatCounts(t *testing.T) {
	t.Parallel()
	st := capRefusing{memory.New(memory.Config{})}
	if _, err := idem.New(st, idem.Config{TenantMaxActive: 1}); err == nil || !strings.Contains(err.Error(), "no count here") {
		t.Fatalf("New: %v, want the store's reason", err)
	}
	e, err := idem.New(st, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.With(func(c *idem.Config) { c.TenantMaxActive = 1 }); err == nil {
		t.Fatal("With: a cap over a store that cannot count was accepted")
	}
}

// NewKeyRate bounds the new keys of the whole Engine, whatever the
// tenant: a client that mints a fresh tenant for every request (a new
// credential each time) is refused past it (429 new-keys-limited, nothing
// reserved), while replays pass and the per-tenant rate would see nothing.
func TestNewKeyRateNeedsNoTenant(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{NewKeyRate: 1, NewKeyBurst: 3, TenantRate: 100})
	for i := range 3 {
		te.want(fmt.Sprint("fresh-", i), fmt.Sprint("k", i), http.StatusCreated)
	}
	te.wantLimited("fresh-3", "k3", idem.SlugNewKeysLimited, "1")
	te.wantLimited("fresh-4", "k4", idem.SlugNewKeysLimited, "1")
	// A replay is not a new key.
	if w := te.want("fresh-0", "k0", http.StatusCreated); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay under the bound: %v", w.Header())
	}
	te.clk.Advance(time.Second)
	te.want("fresh-5", "k5", http.StatusCreated)
	te.wantLimited("fresh-6", "k6", idem.SlugNewKeysLimited, "1")
	if n := te.ran(); n != 4 {
		t.Fatalf("handler ran %d times, want 4", n)
	}
	if _, err := idem.New(memory.New(memory.Config{}), idem.Config{NewKeyRate: -1}); err == nil {
		t.Fatal("a negative NewKeyRate was accepted")
	}
}

// A key the server-wide rate refuses costs its tenant nothing: the
// tenant's token is given back, and once the server has tokens again the
// tenant gets its whole burst.
func TestNewKeyRateRefusalRefundsTheTenant(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{NewKeyRate: 1, NewKeyBurst: 1, TenantRate: 0.001, TenantBurst: 2})
	te.want("other", "k0", http.StatusCreated) // the server's one token
	for i := range 3 {
		te.wantLimited("a", fmt.Sprint("k", i+1), idem.SlugNewKeysLimited, "1")
	}
	te.clk.Advance(time.Second)
	te.want("a", "k4", http.StatusCreated)
	te.clk.Advance(time.Second)
	te.want("a", "k5", http.StatusCreated) // the tenant's second token, kept
}

// successRecorder records the tenants the engine reports a 2xx for.
type successRecorder struct {
	obstest.Recorder
	mu sync.Mutex
	ok []string
}

func (r *successRecorder) TenantReserve(context.Context, string, string) {}

func (r *successRecorder) TenantSucceeded(_ context.Context, tenant string) {
	r.mu.Lock()
	r.ok = append(r.ok, tenant)
	r.mu.Unlock()
}

// The engine reports a tenant to a TenantSuccessObserver only when it
// stored a 2xx answer of it: a tenant whose credential the API refused
// (401) never gets a metric series of its own.
func TestTenantSucceededOnlyOn2xx(t *testing.T) {
	t.Parallel()
	rec := &successRecorder{}
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Observer: rec, Logger: slog.New(slog.DiscardHandler),
		Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenant") != "real" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for _, tenant := range []string{"junk-1", "real", "junk-2", "real"} {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k-"+tenant)
		r.Header.Set("X-Tenant", tenant)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ok) != 1 || rec.ok[0] != "real" {
		t.Fatalf("tenants reported answered 2xx: %v, want [real] (the second is a replay)", rec.ok)
	}
}

// The cap's answer says how many requests the tenant holds in words that
// agree with the number.
func TestTenantMaxActiveDetail(t *testing.T) {
	t.Parallel()
	for max, want := range map[int]string{1: "the tenant holds 1 request waiting", 2: "the tenant holds 2 requests waiting"} {
		te := newTenantEnv(t, idem.Config{Async: true, TenantMaxActive: max})
		for i := range max {
			te.want("a", fmt.Sprint("pending-", i), 202)
		}
		w := te.send("a", "one-more")
		if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), want) {
			t.Errorf("cap %d: %d %s, want 429 saying %q", max, w.Code, w.Body, want)
		}
	}
}

// StoreMaxActive bounds the records active across the store, whatever the
// tenant: callers minting a fresh tenant per request are refused at the
// bound (503 over-capacity, Retry-After until the next count, nothing
// reserved) while duplicates are answered. The store counts at most every
// StoreActiveRecount and the engine adds what it created since, so a
// place freed meanwhile is seen at the next count, not before.
func TestStoreMaxActive(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{StoreMaxActive: 2, StoreActiveRecount: 2 * time.Second})
	release := te.holdRequests([2]string{"fresh-0", "held-0"}, [2]string{"fresh-1", "held-1"})
	te.wantRefused("fresh-2", "k2", http.StatusServiceUnavailable, idem.SlugOverCapacity, "2")
	te.want("fresh-0", "held-0", http.StatusConflict)
	release()
	te.clk.Advance(time.Second)
	te.wantRefused("fresh-3", "k3", http.StatusServiceUnavailable, idem.SlugOverCapacity, "1")
	te.clk.Advance(time.Second)
	te.want("fresh-3", "k3", http.StatusCreated)
	if n := te.ran(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}

// A key refused at the store bound costs its tenant nothing: the tenant's
// token is given back, and once the bound has room the tenant still has
// its whole burst.
func TestStoreMaxActiveRefusalRefundsTheTenant(t *testing.T) {
	t.Parallel()
	te := newTenantEnv(t, idem.Config{StoreMaxActive: 2, StoreActiveRecount: time.Second, TenantRate: 0.001, TenantBurst: 2})
	release := te.holdRequests([2]string{"other", "held-0"}, [2]string{"another", "held-1"})
	for i := range 3 {
		te.wantRefused("a", fmt.Sprint("k", i), http.StatusServiceUnavailable, idem.SlugOverCapacity, "1")
	}
	release()
	te.clk.Advance(time.Second)
	te.want("a", "k3", http.StatusCreated)
	te.want("a", "k4", http.StatusCreated) // the tenant's second token, kept
}

// The bound needs a store that counts its active records: New and With
// refuse it over one that does not, and refuse a negative bound.
func TestStoreMaxActiveNeedsAStoreThatCounts(t *testing.T) {
	t.Parallel()
	st := struct{ store.Store }{memory.New(memory.Config{})}
	if _, err := idem.New(st, idem.Config{StoreMaxActive: 1}); err == nil || !strings.Contains(err.Error(), "StoreMaxActive") {
		t.Fatalf("New over a store that cannot count: %v", err)
	}
	e, err := idem.New(st, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.With(func(c *idem.Config) { c.StoreMaxActive = 1 }); err == nil {
		t.Fatal("With: a bound over a store that cannot count was accepted")
	}
	if _, err := idem.New(memory.New(memory.Config{}), idem.Config{StoreMaxActive: -1}); err == nil {
		t.Fatal("a negative StoreMaxActive was accepted")
	}
}
