package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// reportAPI is an upstream that counts its executions per key. A key in
// hold waits, after telling started, until the test closes its channel.
type reportAPI struct {
	mu      sync.Mutex
	runs    map[string]int
	hold    map[string]chan struct{}
	started chan string
}

func newReportAPI(t *testing.T) (*reportAPI, string) {
	a := &reportAPI{runs: map[string]int{}, hold: map[string]chan struct{}{}, started: make(chan string, 16)}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return a, srv.URL
}

func (a *reportAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.Trim(r.Header.Get("Idempotency-Key"), `"`)
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.runs[key]++
	hold := a.hold[key]
	a.mu.Unlock()
	if hold != nil {
		a.started <- key
		<-hold
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"report":%q,"uri":%q,"body":%q,"auth":%q}`, key, r.RequestURI, body, r.Header.Get("Authorization"))
}

func (a *reportAPI) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[key]
}

// asyncProxyConfig is a proxy with one asynchronous route, callers told
// apart by X-Tenant.
func asyncProxyConfig(upstream, dsn string, workers int) ProxyConfig {
	return ProxyConfig{
		Upstream: upstream, Store: dsn, Async: []string{"POST /v1/reports"}, AsyncWorkers: workers,
		TenantFrom: []string{"header:X-Tenant"}, TenantSecret: []byte("tenant secret"),
	}
}

// asyncStores are the stores two proxies can share: a SQLite file, the
// database servers of the environment and Redis.
func asyncStores(t *testing.T) []sqlServer {
	return append([]sqlServer{{"sqlite", func(t *testing.T) string {
		return "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	}}}, append(sqlServers(t), sqlServer{"redis", func(t *testing.T) string {
		// The URL names no key prefix: the test's keys are its own.
		return testenv.RedisURL(t)
	}})...)
}

func wantProxyAccepted(t *testing.T, r reply, what string) string {
	t.Helper()
	loc := r.header.Get("Location")
	if r.status != http.StatusAccepted || r.header.Get("Retry-After") == "" || !strings.HasPrefix(loc, idem.DefaultStatusPath) {
		t.Fatalf("%s: %d Location %q Retry-After %q %s, want 202", what, r.status, loc, r.header.Get("Retry-After"), r.body)
	}
	return loc
}

// Two proxies share one store: every accepted request runs exactly once,
// whichever proxy accepted it and whichever proxy's worker claimed it.
func TestProxyAsyncTwoProxies(t *testing.T) {
	for _, srv := range asyncStores(t) {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			api, up := newReportAPI(t)
			dsn := srv.dsn(t)
			_, base1, _ := startStoppable(t, asyncProxyConfig(up, dsn, 3))
			_, base2, _ := startStoppable(t, asyncProxyConfig(up, dsn, 3))
			bases := []string{base1, base2}
			c := client(t)
			const n = 30
			locs := make([]string, n)
			run := testenv.Name("r")
			for i := range n {
				r := send(t, c, "POST", bases[i%2]+"/v1/reports?month=11", fmt.Sprint(run, i), fmt.Sprintf(`{"n":%d}`, i),
					"X-Tenant", "acme", "Authorization", "Bearer secret")
				locs[i] = wantProxyAccepted(t, r, "first request")
			}
			for i := range n {
				key := fmt.Sprint(run, i)
				var last reply
				eventually(t, "request "+key+" to complete", func() bool {
					last = send(t, c, "GET", bases[(i+1)%2]+locs[i], "", "", "X-Tenant", "acme")
					return last.status != http.StatusAccepted
				})
				want := fmt.Sprintf(`{"report":%q,"uri":"/v1/reports?month=11","body":"{\"n\":%d}","auth":""}`, key, i)
				if last.status != http.StatusCreated || string(last.body) != want {
					t.Fatalf("%s: %d %s, want 201 %s", key, last.status, last.body, want)
				}
				if got := api.count(key); got != 1 {
					t.Fatalf("%s ran %d times upstream, want once", key, got)
				}
				// A retry through either proxy replays the answer.
				r := send(t, c, "POST", bases[i%2]+"/v1/reports?month=11", key, fmt.Sprintf(`{"n":%d}`, i), "X-Tenant", "acme")
				if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != want {
					t.Fatalf("retry of %s: %d %s", key, r.status, r.body)
				}
			}
			// Another tenant cannot read the status resource.
			if r := send(t, c, "GET", base1+locs[0], "", "", "X-Tenant", "mallory"); r.status != http.StatusNotFound {
				t.Fatalf("another tenant's status read: %d %s", r.status, r.body)
			}
			// A synchronous route beside it is unchanged.
			if r := send(t, c, "POST", base1+"/v1/charges", run+"sync", `{}`, "X-Tenant", "acme"); r.status != http.StatusCreated {
				t.Fatalf("synchronous route: %d %s", r.status, r.body)
			}
		})
	}
}

// A worker that loses its lease while the upstream runs: the sweeper of
// another proxy moves the record to unknown (the default lease policy),
// keeping its fence. The worker's late answer then settles that record, as
// the execution the fence names; had an operator settled it first, the
// late answer is refused and the operator's kept. Nothing runs again.
func TestProxyAsyncLeaseLost(t *testing.T) {
	for _, operatorFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("operator_first=%v", operatorFirst), func(t *testing.T) {
			api, up := newReportAPI(t)
			hold := make(chan struct{})
			api.hold["slow"] = hold
			clock := storetest.NewClock()
			dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
			cfgA := asyncProxyConfig(up, dsn, 1)
			cfgA.StoreClock = clock.Now
			cfgB := asyncProxyConfig(up, dsn, 0) // accepts only
			cfgB.StoreClock = clock.Now
			_, _, stopA := startStoppable(t, cfgA)
			b, baseB, _ := startStoppable(t, cfgB)
			c := client(t)
			loc := wantProxyAccepted(t, send(t, c, "POST", baseB+"/v1/reports", "slow", `{}`, "X-Tenant", "acme"), "first request")
			<-api.started // A's worker forwarded it
			wantProxyAccepted(t, send(t, c, "GET", baseB+loc, "", "", "X-Tenant", "acme"), "status while it runs")
			clock.Advance(time.Hour)
			n, err := b.maint.SweepOnce(context.Background())
			if err != nil || n != 1 {
				t.Fatalf("sweep: %d %v", n, err)
			}
			scope := (&idem.Request{Tenant: headerTenant(t, b, "acme"), Method: "POST", Route: "/v1/reports"}).Scope()
			rec, err := b.Store().Get(context.Background(), scope, "slow")
			if err != nil || rec.State != store.StateUnknown {
				t.Fatalf("after the sweep: %s %v", rec.State, err)
			}
			want := `{"report":"slow"`
			if operatorFirst {
				want = `{"settled":"by an operator"}`
				err := b.Store().Resolve(context.Background(), store.ResolveParams{
					FenceParams: store.FenceParams{Scope: scope, Key: "slow", Fence: rec.Fence},
					To:          store.StateCompleted,
					Response:    &store.Response{Status: http.StatusCreated, Body: []byte(want)},
				})
				if err != nil {
					t.Fatalf("operator's settlement: %v", err)
				}
			}
			close(hold)
			stopA() // waits for A's worker to try to record the answer
			for _, r := range []reply{
				send(t, c, "GET", baseB+loc, "", "", "X-Tenant", "acme"),
				send(t, c, "POST", baseB+"/v1/reports", "slow", `{}`, "X-Tenant", "acme"),
			} {
				if r.status != http.StatusCreated || !strings.HasPrefix(string(r.body), want) {
					t.Fatalf("after the lease was lost: %d %s, want 201 %s...", r.status, r.body, want)
				}
			}
			if got := api.count("slow"); got != 1 {
				t.Fatalf("upstream ran %d times, want once", got)
			}
		})
	}
}

// A request no worker claims before --async-wait ends with 408, stored.
func TestProxyAsyncExpires(t *testing.T) {
	api, up := newReportAPI(t)
	clock := storetest.NewClock()
	cfg := asyncProxyConfig(up, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), 0)
	cfg.StoreClock = clock.Now
	cfg.AsyncWait = time.Minute
	p, base, _ := startStoppable(t, cfg)
	c := client(t)
	loc := wantProxyAccepted(t, send(t, c, "POST", base+"/v1/reports", "late", `{}`, "X-Tenant", "acme"), "first request")
	if n, err := p.maint.ExpirePendingOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("expiry before the deadline: %d %v", n, err)
	}
	clock.Advance(time.Minute)
	if n, err := p.maint.ExpirePendingOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("expiry at the deadline: %d %v", n, err)
	}
	for _, r := range []reply{
		send(t, c, "GET", base+loc, "", "", "X-Tenant", "acme"),
		send(t, c, "POST", base+"/v1/reports", "late", `{}`, "X-Tenant", "acme"),
	} {
		if r.status != http.StatusRequestTimeout || !strings.Contains(string(r.body), idem.SlugPendingExpired) {
			t.Fatalf("expired request: %d %s", r.status, r.body)
		}
	}
	if api.count("late") != 0 {
		t.Fatal("an expired request reached the upstream")
	}
	rec, err := p.Store().Get(context.Background(), (&idem.Request{Tenant: headerTenant(t, p, "acme"), Method: "POST", Route: "/v1/reports"}).Scope(), "late")
	if err != nil || rec.State != store.StateCompleted || rec.LastError != store.ExpiredPendingError {
		t.Fatalf("record: %s %q %v", rec.State, rec.LastError, err)
	}
}

// headerTenant is the tenant the proxy names for X-Tenant: value.
func headerTenant(t *testing.T, p *Proxy, value string) string {
	t.Helper()
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Tenant", value)
	tn, err := p.tenants.tenant(r)
	if err != nil {
		t.Fatal(err)
	}
	return tn
}

// Credentials are kept for the upstream only when named; status reads
// need a tenant like keyed requests.
func TestProxyAsyncHeadersAndTenants(t *testing.T) {
	_, up := newReportAPI(t)
	cfg := asyncProxyConfig(up, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), 2)
	cfg.AsyncKeepHeaders = []string{"Authorization"}
	_, base, _ := startStoppable(t, cfg)
	c := client(t)
	loc := wantProxyAccepted(t, send(t, c, "POST", base+"/v1/reports", "k", `{}`, "X-Tenant", "acme", "Authorization", "Bearer worker"), "first")
	var last reply
	eventually(t, "the request to complete", func() bool {
		last = send(t, c, "GET", base+loc, "", "", "X-Tenant", "acme")
		return last.status != http.StatusAccepted
	})
	if !strings.Contains(string(last.body), `"auth":"Bearer worker"`) {
		t.Fatalf("kept Authorization did not reach the upstream: %s", last.body)
	}
	if r := send(t, c, "GET", base+loc, "", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("status read without a tenant: %d %s", r.status, r.body)
	}
	if r := send(t, c, "GET", base+idem.DefaultStatusPath+"not-an-id", "", "", "X-Tenant", "acme"); r.status != http.StatusNotFound {
		t.Fatalf("status read of a bad id: %d %s", r.status, r.body)
	}
}

func TestProxyAsyncConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*ProxyConfig)
		want string
	}{
		{"no path", func(c *ProxyConfig) { c.Async = []string{"POST"} }, "want METHOD /path"},
		{"unprotected method", func(c *ProxyConfig) { c.Async = []string{"GET /v1/reports"} }, "not a protected method"},
		{"bad pattern", func(c *ProxyConfig) { c.Async = []string{"POST /v1/{bad"} }, "--async"},
		{"status path", func(c *ProxyConfig) { c.Async = []string{"POST /.idem/requests/x"} }, "status resources"},
		{"two patterns in one", func(c *ProxyConfig) { c.Async = []string{"POST /a, post /b"} }, "want METHOD /path"},
		{"wait beyond ttl", func(c *ProxyConfig) { c.TTL = time.Hour; c.AsyncWait = 2 * time.Hour }, "AsyncWait"},
		{"negative workers", func(c *ProxyConfig) { c.AsyncWorkers = -1 }, "async-workers"},
		{"bad keep header", func(c *ProxyConfig) { c.AsyncKeepHeaders = []string{"Bad Name"} }, "AsyncKeepHeaders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := asyncProxyConfig("http://127.0.0.1:1", "memory:", 1)
			cfg.Listen = "127.0.0.1:0"
			cfg.Logger = slog.New(slog.DiscardHandler)
			tc.mod(&cfg)
			p, err := NewProxy(context.Background(), cfg)
			if err == nil {
				p.closeAll()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to mention %q", err, tc.want)
			}
		})
	}
	var stderr strings.Builder
	if _, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--async-workers", "-1"}, &stderr); err == nil {
		t.Fatal("--async-workers -1: no error")
	}
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--async", "POST /a", "--async", "POST /b,PUT /c/{x},d",
		"--async-keep-headers", "Authorization,Cookie", "--async-wait", "5m"}, &stderr)
	if err != nil || !slices.Equal(cfg.Async, []string{"POST /a", "POST /b", "PUT /c/{x},d"}) || len(cfg.AsyncKeepHeaders) != 2 || cfg.AsyncWait != 5*time.Minute || cfg.AsyncWorkers != idem.DefaultWorkerConcurrency {
		t.Fatalf("flags: %+v %v", cfg, err)
	}
}

// An asynchronous route of the config file is what --async makes of its
// pattern, with the route's fields and lease policy applied to the
// asynchronous engine; --async for the same pattern adds nothing, and
// --async for a route of the file makes that route asynchronous with its
// settings. The other routes stay as they were.
func TestProxyConfigFileAsyncRoutes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, async string
		args        []string
	}{
		{"file", `, "async": true`, nil},
		{"file and flag", `, "async": true`, []string{"--async", "POST  /v1/reports"}},
		{"flag on a route of the file", "", []string{"--async", "POST /v1/reports"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api, up := newReportAPI(t)
			path := writeConfig(t, `{"async-poll": "20ms", "routes": [
				{"route": "POST /login", "protected": false},
				{"route": "POST /v1/reports", "fields": ["month"], "lease-policy": "retry"`+tc.async+`},
				{"route": "POST /v1/charges", "fields": ["amount"]}
			]}`)
			p, base := proxyFromFlags(t, up, append([]string{"--config", path}, tc.args...)...)
			c := client(t)

			loc := wantProxyAccepted(t, send(t, c, "POST", base+"/v1/reports", "r1", `{"month":"11","note":"a"}`), "first request")
			var last reply
			eventually(t, "the report to complete", func() bool {
				last = send(t, c, "GET", base+loc, "", "")
				return last.status != http.StatusAccepted
			})
			want := `{"report":"r1","uri":"/v1/reports","body":"{\"month\":\"11\",\"note\":\"a\"}","auth":""}`
			if last.status != http.StatusCreated || string(last.body) != want {
				t.Fatalf("status resource: %d %s, want 201 %s", last.status, last.body, want)
			}
			// The route's fields: another note is the same request, another
			// month is not.
			if r := send(t, c, "POST", base+"/v1/reports", "r1", `{"month":"11","note":"b"}`); r.status != http.StatusCreated ||
				r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != want {
				t.Fatalf("retry with another note: %d %s, want the replay", r.status, r.body)
			}
			if r := send(t, c, "POST", base+"/v1/reports", "r1", `{"month":"12"}`); r.status != http.StatusUnprocessableEntity {
				t.Fatalf("retry with another month: %d %s, want 422", r.status, r.body)
			}
			if n := api.count("r1"); n != 1 {
				t.Fatalf("the report ran %d times upstream, want once", n)
			}
			// The route's lease policy is the record's.
			rec, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/reports"), "r1")
			if err != nil || rec.LeasePolicy != store.LeaseRetry {
				t.Fatalf("record: policy %q, %v; want retry", rec.LeasePolicy, err)
			}

			// The synchronous routes are unchanged: the upstream's answer
			// at once, its route's fields, no key needed where unprotected.
			r := send(t, c, "POST", base+"/v1/charges", "c1", `{"amount":1,"note":"a"}`)
			if r.status != http.StatusCreated || r.header.Get("Location") != "" || api.count("c1") != 1 {
				t.Fatalf("synchronous route: %d %v %s", r.status, r.header, r.body)
			}
			if r := send(t, c, "POST", base+"/v1/charges", "c1", `{"amount":1,"note":"b"}`); r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("synchronous retry with another note: %d %s, want the replay", r.status, r.body)
			}
			if r := send(t, c, "POST", base+"/login", "", `{}`); r.status != http.StatusCreated {
				t.Fatalf("unprotected route: %d %s", r.status, r.body)
			}
			if r := send(t, c, "POST", base+"/v1/other", "o1", `{}`); r.status != http.StatusCreated || r.header.Get("Location") != "" {
				t.Fatalf("a path of no route: %d %v", r.status, r.header)
			}
		})
	}
}

// What an asynchronous route cannot be or take stops the proxy at start,
// with an error naming the route.
func TestProxyConfigFileAsyncErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		file string
		args []string
		want string
	}{
		{`{"routes": [{"route": "POST /a", "ttl": "1h", "async": true}]}`, nil, `route "POST /a": ttl and lease do not apply to an asynchronous route`},
		{`{"routes": [{"route": "POST /a", "lease": "1m", "async": true}]}`, nil, `route "POST /a": ttl and lease do not apply to an asynchronous route`},
		{`{"routes": [{"route": "POST /a", "ttl": "1h"}]}`, []string{"--async", "POST /a"}, `route "POST /a": ttl and lease do not apply`},
		{`{"routes": [{"route": "POST /a", "protected": false, "async": true}]}`, nil, `route "POST /a": an asynchronous route`},
		{`{"routes": [{"route": "POST /a", "protected": false}]}`, []string{"--async", "POST /a"}, `route "POST /a": an asynchronous route`},
		{`{"routes": [{"route": "/a", "async": true}]}`, nil, `route "/a": want METHOD /path`},
		{`{"routes": [{"route": "POST example.com/a", "async": true}]}`, nil, `route "POST example.com/a": want METHOD /path`},
		{`{"routes": [{"route": "POST /.idem/requests/a", "async": true}]}`, nil, `status resources`},
		{`{"routes": [{"route": "POST /a", "async": "yes"}]}`, nil, `routes[0]: "async": got a JSON string, want true or false`},
		{`{"ttl": "1m", "async-wait": "1h", "routes": [{"route": "POST /a", "async": true}]}`, nil, `AsyncWait`},
	} {
		path := writeConfig(t, tt.file)
		args := append([]string{"proxy", "--upstream", "http://x", "--store", "memory:", "--single-tenant", "--config", path}, tt.args...)
		_, errOut, err := run(args...)
		if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, tt.want) {
			t.Errorf("%s %q: %v, want a usage error with %q:\n%s", tt.file, tt.args, err, tt.want, errOut)
		}
	}
	// An asynchronous route whose pattern conflicts with an --async one.
	_, err := NewProxy(context.Background(), ProxyConfig{Upstream: "http://x", Store: "memory:", Listen: "127.0.0.1:0",
		SingleTenant: true, Async: []string{"POST /a/{x}"}, Routes: []RouteConfig{{Pattern: "POST /a/{y}", Async: true}}})
	if err == nil || !strings.Contains(err.Error(), `route "POST /a/{y}"`) {
		t.Errorf("conflicting asynchronous patterns: %v, want an error naming the route", err)
	}
}

// The config file's "async" member, a list, is one --async per pattern.
func TestProxyConfigFileAsyncList(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, `{"async": ["POST /v1/reports", "POST /v1/exports/{kind}"]}`)
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--config", path}, io.Discard)
	if err != nil || !slices.Equal(cfg.Async, []string{"POST /v1/reports", "POST /v1/exports/{kind}"}) {
		t.Fatalf("async from the config file: %q %v", cfg.Async, err)
	}
}

// The status resources serve asynchronous requests only: a synchronous
// route's stored answer is replayed to a retry whose body matches, never
// to a read of its status resource (which checks no body).
func TestProxyStatusServesAsyncOnly(t *testing.T) {
	t.Parallel()
	_, up := newReportAPI(t)
	_, base, _ := startStoppable(t, asyncProxyConfig(up, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), 2))
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "k1", `{"amount":1}`, "X-Tenant", "acme"); r.status != http.StatusCreated {
		t.Fatalf("synchronous request: %d %s", r.status, r.body)
	}
	id := base64.RawURLEncoding.EncodeToString([]byte("POST /v1/charges\x00k1"))
	r := send(t, c, "GET", base+idem.DefaultStatusPath+id, "", "", "X-Tenant", "acme")
	if r.status != http.StatusNotFound || strings.Contains(string(r.body), `"report"`) {
		t.Fatalf("status read of a synchronous request: %d %s, want 404", r.status, r.body)
	}
	// An asynchronous request's is served.
	loc := wantProxyAccepted(t, send(t, c, "POST", base+"/v1/reports", "k1", `{}`, "X-Tenant", "acme"), "async")
	eventually(t, "the request to complete", func() bool {
		r = send(t, c, "GET", base+loc, "", "", "X-Tenant", "acme")
		return r.status != http.StatusAccepted
	})
	if r.status != http.StatusCreated {
		t.Fatalf("status read of an asynchronous request: %d %s", r.status, r.body)
	}
}

// An asynchronous request whose upstream answer breaks off (a length the
// upstream did not keep): the worker's request has no server behind it,
// and the reverse proxy only logged the failure, so the fragment was
// stored as the completed answer. It is uncertain: the record goes to
// unknown, for reconciliation.
func TestProxyAsyncCutAnswerIsUnknown(t *testing.T) {
	t.Parallel()
	up, calls := cutUpstream(t, `{"report":"par`)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	p, base := startProxy(t, asyncProxyConfig(up.URL, dsn, 1))
	c := client(t)
	loc := wantProxyAccepted(t, send(t, c, "POST", base+"/v1/reports", "r1", `{"n":1}`, "X-Tenant", "acme"), "first")
	var last reply
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		last = send(t, c, "GET", base+loc, "", "", "X-Tenant", "acme")
		if last.status != http.StatusAccepted {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	tenant, _ := p.tenants.tenant(&http.Request{Header: http.Header{"X-Tenant": {"acme"}}})
	rec, err := p.Store().Get(context.Background(), scopeOf(tenant, "POST", "/v1/reports"), "r1")
	if err != nil || rec.State != store.StateUnknown || calls.Load() != 1 {
		t.Fatalf("status resource %d %q; record %s (%v), upstream calls %d; want unknown after one call", last.status, last.body, rec.State, err, calls.Load())
	}
}

// An asynchronous pattern matches a path as the other routes do: a path
// the mux would redirect (not clean, or without its trailing slash)
// matches no route, whatever pattern it would reach after the redirect.
func TestAsyncRoutesMatchCleanPathsOnly(t *testing.T) {
	routes, err := newAsyncRoutes([]string{"POST /v1/reports", "POST /v1/batch/"}, map[string]bool{"POST": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"/v1/reports":          true,
		"/v1/batch/7":          true,
		"/v1/x/../reports":     false,
		"/v1//reports":         false,
		"/v1/./reports":        false,
		"/v1/batch":            false,
		"/v1/batch/../reports": false,
	} {
		r := httptest.NewRequest(http.MethodPost, "http://api.test/", nil)
		r.URL.Path = path
		if _, got := routes.match(r); got != want {
			t.Errorf("POST %s: async %v, want %v", path, got, want)
		}
	}
}
