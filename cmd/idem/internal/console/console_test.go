package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

type fixture struct {
	t       *testing.T
	s       store.Store
	h       *console.Handler
	srv     *httptest.Server
	c       *http.Client
	log     *testenv.Buffer         // the console's log, as JSON lines
	metrics *sdkmetric.ManualReader // the console's metrics
}

// token is the fixture's console token.
const token = "s3cret-console-token-0123456789abcdef"

func newFixture(t *testing.T) *fixture {
	return newFixtureWith(t, console.Credentials{Token: token}, "0.0.0.0:9090")
}

func newFixtureWith(t *testing.T, creds console.Credentials, addr string) *fixture {
	return newFixtureOn(t, memory.New(memory.Config{}), creds, addr)
}

func newFixtureOn(t *testing.T, s store.Store, creds console.Credentials, addr string) *fixture {
	m, err := maintenance.New(s, maintenance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	logs, reader := &testenv.Buffer{}, sdkmetric.NewManualReader()
	h, err := console.New(console.Config{Store: func() store.Store { return s }, Settle: m.Settle,
		Tenant:      func(c string) (string, error) { return "auth:" + c, nil },
		Credentials: creds, Addr: addr,
		Logger:        slog.New(slog.NewJSONHandler(logs, nil)),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &fixture{t: t, s: s, h: h, srv: srv, c: c, log: logs, metrics: reader}
}

// unknown makes a record whose outcome is unknown and returns its fence.
func (f *fixture) unknown(tenant, route, key string) int64 {
	scope := (&idem.Request{Tenant: tenant, Method: "POST", Route: route}).Scope()
	res, err := f.s.Reserve(context.Background(), store.ReserveParams{Scope: scope, Key: key, Fingerprint: "fp",
		Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.s.MarkUnknown(context.Background(), store.ReleaseParams{FenceParams: store.FenceParams{
		Scope: scope, Key: key, Fence: res.Record.Fence}, Error: "upstream hung up"}); err != nil {
		f.t.Fatal(err)
	}
	return res.Record.Fence
}

func (f *fixture) do(method, path string, form url.Values, hdr map[string]string) (int, string) {
	f.t.Helper()
	resp, body := f.send(method, path, form, hdr)
	return resp.StatusCode, body
}

// send is do, returning the whole response (its body already read).
func (f *fixture) send(method, path string, form url.Values, hdr map[string]string) (*http.Response, string) {
	f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, f.srv.URL+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		f.t.Fatalf("%s %s: CSP %q", method, path, csp)
	}
	return resp, string(b)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// k2Row is how a result row shows the record with key k2: the text of its
// link. Matching the bare "k2" would also match a page's random CSRF token.
const k2Row = ">k2</a>"

func TestConsole(t *testing.T) {
	f := newFixture(t)
	f.unknown("auth:abc", "/v1/charges", `k-<script>alert(1)</script>`)
	fence := f.unknown("auth:other", "/v1/charges", "k2")

	if code, _ := f.do("GET", "/console/", nil, nil); code != http.StatusSeeOther {
		t.Fatalf("without credentials: %d, want a redirect to the login page", code)
	}
	if code, _ := f.do("GET", "/console/", nil, map[string]string{"Authorization": "Bearer wrong"}); code != http.StatusUnauthorized {
		t.Fatalf("wrong bearer token: %d, want 401", code)
	}
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {"wrong"}}, nil); code != http.StatusUnauthorized {
		t.Fatalf("login with a wrong token: %d, want 401", code)
	}
	if code, body := f.do("GET", "/console/unknown", nil, map[string]string{"Authorization": "Bearer " + token}); code != 200 || !strings.Contains(body, k2Row) {
		t.Fatalf("bearer token: %d", code)
	}
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {token}}, nil); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}

	// Search by tenant and by the key as the client sent it, quoted.
	code, body := f.do("GET", "/console/?"+url.Values{"tenant": {"auth:abc"}, "key": {`"k-<script>alert(1)</script>"`}}.Encode(), nil, nil)
	if code != 200 || strings.Contains(body, "<script>alert") || !strings.Contains(body, "k-&lt;script&gt;") || strings.Contains(body, k2Row) {
		t.Fatalf("search: %d\n%s", code, body)
	}
	if code, body := f.do("GET", "/console/?key=%22unterminated", nil, nil); code != 400 || !strings.Contains(body, "key:") {
		t.Fatalf("bad key: %d", code)
	}
	if code, _ := f.do("GET", "/console/?after=garbage", nil, nil); code != 400 {
		t.Fatalf("bad cursor: %d", code)
	}

	scope := (&idem.Request{Tenant: "auth:other", Method: "POST", Route: "/v1/charges"}).Scope()
	code, body = f.do("GET", "/console/record?"+url.Values{"scope": {scope}, "key": {"k2"}}.Encode(), nil, nil)
	if code != 200 || !strings.Contains(body, "upstream hung up") {
		t.Fatalf("record page: %d", code)
	}
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the record page")
	}
	if !strings.Contains(body, fmt.Sprintf(`name="fence" value="%d"`, fence)) {
		t.Fatal("the record page's forms do not name the record's fence")
	}
	act := url.Values{"scope": {scope}, "key": {"k2"}, "fence": {fmt.Sprint(fence)}, "action": {"completed"}, "status": {"201"},
		"content_type": {"application/json"}, "body": {`{"id":1}`}, "confirm": {"yes"}}
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusForbidden {
		t.Fatalf("POST without the CSRF token: %d, want 403", code)
	}
	act.Set("csrf", m[1])
	if code, _ := f.do("POST", "/console/act", act, map[string]string{"Origin": "https://evil.example"}); code != http.StatusForbidden {
		t.Fatalf("cross-origin POST: %d, want 403", code)
	}
	act.Del("confirm")
	if code, body := f.do("POST", "/console/act", act, nil); code != 200 || !strings.Contains(body, `name="confirm" value="yes"`) {
		t.Fatalf("confirmation page: %d", code)
	}
	if rec, _ := f.s.Get(context.Background(), scope, "k2"); rec.State != store.StateUnknown {
		t.Fatalf("the confirmation page settled the record: %s", rec.State)
	}
	act.Set("confirm", "yes")
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusSeeOther {
		t.Fatalf("confirmed: %d", code)
	}
	rec, _ := f.s.Get(context.Background(), scope, "k2")
	if rec.State != store.StateCompleted || rec.Response.Status != 201 || string(rec.Response.Body) != `{"id":1}` {
		t.Fatalf("after settling: %s %+v", rec.State, rec.Response)
	}
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusConflict {
		t.Fatalf("settling a completed record: %d, want 409", code)
	}
	act.Set("action", "delete")
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusSeeOther {
		t.Fatalf("delete: %d", code)
	}
	if _, err := f.s.Get(context.Background(), scope, "k2"); err != store.ErrNotFound {
		t.Fatalf("after delete: %v", err)
	}
}

func TestConsoleRefusesWithoutCredentials(t *testing.T) {
	s := memory.New(memory.Config{})
	settle := func(context.Context, string, string, int64, maintenance.Resolution) error { return nil }
	st := func() store.Store { return s }
	if _, err := console.New(console.Config{Store: st, Settle: settle, Addr: "0.0.0.0:9090"}); err == nil {
		t.Fatal("a console without credentials on a public address")
	}
	if _, err := console.New(console.Config{Store: st, Settle: settle, Addr: "127.0.0.1:9090"}); err != nil {
		t.Fatalf("loopback without credentials: %v", err)
	}
	if _, err := console.New(console.Config{Store: st, Settle: settle, Addr: "[::1]:9090", Credentials: console.Credentials{User: "u"}}); err == nil {
		t.Fatal("a user without a password")
	}
}

// deadLetter makes an unknown record the reconciler gave up on.
func (f *fixture) deadLetter(tenant, route, key string) string {
	fence := f.unknown(tenant, route, key)
	scope := (&idem.Request{Tenant: tenant, Method: "POST", Route: route}).Scope()
	if err := f.s.Defer(context.Background(), store.DeferParams{FenceParams: store.FenceParams{Scope: scope, Key: key, Fence: fence},
		DeadLetter: true, Error: "resolver kept failing"}); err != nil {
		f.t.Fatal(err)
	}
	return scope
}

func TestConsoleDeadLetters(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	f.unknown("t", "/v1/charges", "still-unknown")
	scope := f.deadLetter("t", "/v1/charges", "given-up")
	f.deadLetter("t", "/v1/charges", "given-up-2")

	code, body := f.do("GET", "/console/dead-letters", nil, auth)
	if code != 200 || !strings.Contains(body, "given-up") || strings.Contains(body, "still-unknown") ||
		!strings.Contains(body, `href="/console/dead-letters"`) {
		t.Fatalf("dead letters page: %d\n%s", code, body)
	}
	code, body = f.do("GET", "/console/unknown", nil, auth)
	if code != 200 || !strings.Contains(body, "still-unknown") || strings.Contains(body, "given-up") {
		t.Fatalf("unknown queue: %d\n%s", code, body)
	}

	// Each action of a dead letter asks for confirmation, then settles it.
	code, body = f.do("GET", "/console/record?"+url.Values{"scope": {scope}, "key": {"given-up"}}.Encode(), nil, auth)
	for _, action := range []string{"completed", "not_happened", "run_again", "delete"} {
		if !strings.Contains(body, `name="action" value="`+action+`"`) {
			t.Errorf("a dead letter's record page lacks the %s action", action)
		}
	}
	m := csrfRe.FindStringSubmatch(body)
	if code != 200 || m == nil {
		t.Fatalf("record page: %d", code)
	}
	act := url.Values{"csrf": {m[1]}, "scope": {scope}, "key": {"given-up"}, "fence": {fmt.Sprint(f.get(scope, "given-up").Fence)}, "action": {"run_again"}}
	if code, body := f.do("POST", "/console/act", act, auth); code != 200 || !strings.Contains(body, "run again") {
		t.Fatalf("run again, unconfirmed: %d\n%s", code, body)
	}
	if rec, _ := f.s.Get(context.Background(), scope, "given-up"); rec.State != store.StateUnknown {
		t.Fatalf("the confirmation page settled the record: %s", rec.State)
	}
	act.Set("confirm", "yes")
	if code, _ := f.do("POST", "/console/act", act, auth); code != http.StatusSeeOther {
		t.Fatalf("run again: %d", code)
	}
	rec, _ := f.s.Get(context.Background(), scope, "given-up")
	if rec.State != store.StateFailedRetryable || rec.DeadLettered() {
		t.Fatalf("after run again: %s, dead-lettered %v", rec.State, rec.DeadLettered())
	}
	// Deleting a dead letter leads back to the dead letters.
	act = url.Values{"csrf": {m[1]}, "scope": {scope}, "key": {"given-up-2"}, "action": {"delete"}, "from": {"dead-letters"}, "confirm": {"yes"}}
	resp, _ := f.send("POST", "/console/act", act, map[string]string{"Authorization": "Bearer " + token})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/dead-letters" {
		t.Fatalf("delete: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if code, body := f.do("GET", "/console/dead-letters", nil, auth); code != 200 || strings.Contains(body, "given-up") {
		t.Fatalf("dead letters after settling both: %d\n%s", code, body)
	}
}

// The dead letters page pages through the unknown records: 60 dead
// letters among unknown records fill a page of 50 and a second of 10.
func TestConsoleDeadLettersPaging(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	for i := range 60 {
		f.deadLetter("t", "/v1/charges", fmt.Sprintf("dead-%02d", i))
		f.unknown("t", "/v1/charges", fmt.Sprintf("live-%02d", i))
	}
	next := regexp.MustCompile(`href="\?([^"]+)" id="next"`)
	code, body := f.do("GET", "/console/dead-letters", nil, auth)
	if code != 200 || strings.Count(body, ">dead-") != 50 || strings.Contains(body, ">live-") {
		t.Fatalf("first page: %d, %d dead letters\n%s", code, strings.Count(body, ">dead-"), body)
	}
	m := next.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no next page link")
	}
	q, _ := url.ParseQuery(html.UnescapeString(m[1]))
	code, body = f.do("GET", "/console/dead-letters?"+q.Encode(), nil, auth)
	if code != 200 || strings.Count(body, ">dead-") != 10 || next.MatchString(body) {
		t.Fatalf("second page: %d, %d dead letters, next link %v", code, strings.Count(body, ">dead-"), next.MatchString(body))
	}
}

func (f *fixture) get(scope, key string) store.Record {
	f.t.Helper()
	rec, err := f.s.Get(context.Background(), scope, key)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

// racing is a store that runs then, once set, right after its next Get:
// the record changes between the console's read and its write.
type racing struct {
	store.Store
	mu   sync.Mutex
	then func()
}

func (r *racing) Get(ctx context.Context, scope, key string) (store.Record, error) {
	rec, err := r.Store.Get(ctx, scope, key)
	r.mu.Lock()
	then := r.then
	r.then = nil
	r.mu.Unlock()
	if then != nil {
		then()
	}
	return rec, err
}

// A delete from a page that showed one execution keeps the record when it
// ran again after the console read it to confirm: the store checks the
// page's fence in the same step as the delete, and the answer of the new
// execution stays for the next retry to replay.
func TestConsoleDeleteBoundToFenceAtomically(t *testing.T) {
	mem := memory.New(memory.Config{})
	r := &racing{Store: mem}
	f := newFixtureOn(t, r, console.Credentials{Token: token}, "0.0.0.0:9090")
	auth := map[string]string{"Authorization": "Bearer " + token}
	first := f.unknown("t", "/v1/charges", "k")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	csrf := f.recordCSRF(scope, "k", auth)
	var answered store.Record
	r.mu.Lock()
	r.then = func() {
		// Settled elsewhere, retried, and answered under a new fence.
		ctx := context.Background()
		if err := mem.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: scope, Key: "k", Fence: first}, To: store.StateFailedRetryable}); err != nil {
			t.Error(err)
			return
		}
		res, err := mem.Reserve(ctx, store.ReserveParams{Scope: scope, Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
		if err != nil || res.Outcome != store.Reclaimed {
			t.Errorf("retry: %v %v", res.Outcome, err)
			return
		}
		if err := mem.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: scope, Key: "k", Fence: res.Record.Fence},
			Response: store.Response{Status: http.StatusCreated, Body: []byte(`{"id":"ch_2"}`)}}); err != nil {
			t.Error(err)
		}
		answered, _ = mem.Get(ctx, scope, "k")
	}
	r.mu.Unlock()
	act := url.Values{"csrf": {csrf}, "scope": {scope}, "key": {"k"}, "fence": {fmt.Sprint(first)}, "action": {"delete"}, "confirm": {"yes"}}
	code, body := f.do("POST", "/console/act", act, auth)
	if code != http.StatusConflict || !strings.Contains(body, "ran again") || !strings.Contains(body, "nothing was deleted") {
		t.Fatalf("a delete about the execution the page showed, the record answered since: %d\n%s", code, body)
	}
	if rec := f.get(scope, "k"); rec.State != store.StateCompleted || rec.Fence != answered.Fence || answered.Fence == first {
		t.Fatalf("after the refused delete: %s fence %d (answered at %d, shown at %d)", rec.State, rec.Fence, answered.Fence, first)
	}
	if d := f.audits("delete"); len(d) != 1 || d[0]["result"] != "conflict" {
		t.Fatalf("audit lines of the delete: %v", d)
	}
}

// A settlement from a page that showed one execution is refused once the
// record ran again (released, run, unknown again): 409, nothing changed.
func TestConsoleSettlementBoundToFence(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	first := f.unknown("t", "/v1/charges", "k")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	csrf := f.recordCSRF(scope, "k", auth)
	act := url.Values{"csrf": {csrf}, "scope": {scope}, "key": {"k"}, "fence": {fmt.Sprint(first)}, "action": {"not_happened"}, "confirm": {"yes"}}
	if code, _ := f.do("POST", "/console/act", act, auth); code != http.StatusSeeOther {
		t.Fatalf("not happened: %d", code)
	}
	// The retry runs and its outcome is unknown again.
	ctx := context.Background()
	res, err := f.s.Reserve(ctx, store.ReserveParams{Scope: scope, Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
	if err != nil || res.Outcome != store.Reclaimed {
		t.Fatalf("retry: %v %v", res.Outcome, err)
	}
	if err := f.s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: scope, Key: "k", Fence: res.Record.Fence}}); err != nil {
		t.Fatal(err)
	}
	// The same form again (a second tab, a resubmitted form).
	code, body := f.do("POST", "/console/act", act, auth)
	if code != http.StatusConflict || !strings.Contains(body, "ran again") {
		t.Fatalf("the first execution's settlement on the second: %d\n%s", code, body)
	}
	if rec := f.get(scope, "k"); rec.State != store.StateUnknown || rec.Fence != res.Record.Fence {
		t.Fatalf("after the refused settlement: %s fence %d", rec.State, rec.Fence)
	}
	act.Del("fence")
	if code, _ := f.do("POST", "/console/act", act, auth); code != http.StatusBadRequest {
		t.Fatalf("a settlement without a fence: %d, want 400", code)
	}
}

// recordCSRF opens the record page of (scope, key) and returns the CSRF
// token of its forms.
func (f *fixture) recordCSRF(scope, key string, hdr map[string]string) string {
	f.t.Helper()
	_, body := f.do("GET", "/console/record?"+url.Values{"scope": {scope}, "key": {key}}.Encode(), nil, hdr)
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		f.t.Fatal("no CSRF token on the record page")
	}
	return m[1]
}

// doHost is do with another Host header.
func (f *fixture) doHost(host, path string) int {
	f.t.Helper()
	req, _ := http.NewRequest("GET", f.srv.URL+path, nil)
	req.Host = host
	resp, err := f.c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Without credentials the console answers loopback host names only: a
// page of evil.example that rebinds its name to 127.0.0.1 sends Host:
// evil.example and gets nothing.
func TestConsoleWithoutCredentialsAnswersLoopbackHostsOnly(t *testing.T) {
	f := newFixtureWith(t, console.Credentials{}, "127.0.0.1:9090")
	f.unknown("t", "/v1/charges", "k1")
	port := strings.TrimPrefix(f.srv.URL, "http://127.0.0.1:")
	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1.evil.example:" + port, "10.0.0.1:" + port} {
		if code := f.doHost(host, "/console/unknown"); code != http.StatusMisdirectedRequest {
			t.Errorf("Host %s: %d, want 421", host, code)
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "127.0.0.1:9090"} {
		if code := f.doHost(host, "/console/unknown"); code != http.StatusOK {
			t.Errorf("Host %s: %d, want 200", host, code)
		}
	}
}

// Each session has its own CSRF token, also without credentials: the
// token of one browser does not let another post.
func TestConsoleCSRFPerSession(t *testing.T) {
	f := newFixtureWith(t, console.Credentials{}, "127.0.0.1:9090")
	f.unknown("t", "/v1/charges", "k1")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	page := "/console/record?" + url.Values{"scope": {scope}, "key": {"k1"}}.Encode()
	_, a := f.do("GET", page, nil, nil)
	other := newFixtureWith(t, console.Credentials{}, "127.0.0.1:9090")
	other.srv, other.s = f.srv, f.s // the same console, another browser
	_, b := other.do("GET", page, nil, nil)
	ta, tb := csrfRe.FindStringSubmatch(a), csrfRe.FindStringSubmatch(b)
	if ta == nil || tb == nil || ta[1] == tb[1] {
		t.Fatalf("two browsers' CSRF tokens: %v %v, want two different ones", ta, tb)
	}
	act := url.Values{"csrf": {ta[1]}, "scope": {scope}, "key": {"k1"}, "action": {"delete"}, "confirm": {"yes"}}
	if code, _ := other.do("POST", "/console/act", act, nil); code != http.StatusForbidden {
		t.Fatalf("a POST with another session's token: %d, want 403", code)
	}
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusSeeOther {
		t.Fatalf("a POST with its own session's token: %d", code)
	}
	// Nobody signed in: no sign-in line, and the action names the
	// loopback operator.
	if d := f.audits("delete"); len(d) != 1 || len(f.audits("login")) != 0 {
		t.Fatalf("audit lines: %d deletes, %d sign-ins\n%s", len(d), len(f.audits("login")), f.log.String())
	} else {
		want(t, d[0], map[string]any{"operator": "loopback", "result": "ok", "state_after": "absent"})
	}
}

// Failed sign-ins are throttled by address: after 5 in a row, each
// attempt waits (429 with Retry-After), the right token included, and the
// wait grows; once it passed, the right token signs in.
func TestConsoleThrottlesFailedSignIns(t *testing.T) {
	f := newFixture(t)
	now := time.Now()
	console.SetNow(f.h, func() time.Time { return now })
	var throttled int
	for i := range 30 {
		code, _ := f.do("POST", "/console/login", url.Values{"token": {fmt.Sprint("wrong-", i)}}, nil)
		switch {
		case i < 5 && code != http.StatusUnauthorized:
			t.Fatalf("attempt %d: %d, want 401", i, code)
		case code == http.StatusTooManyRequests:
			throttled++
		}
	}
	if throttled < 24 {
		t.Fatalf("%d of 30 wrong tokens were throttled, want all but the first 6", throttled)
	}
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {token}}, nil); code != http.StatusTooManyRequests {
		t.Fatalf("the right token while locked out: %d, want 429", code)
	}
	if code, _ := f.do("GET", "/console/unknown", nil, map[string]string{"Authorization": "Bearer " + token}); code != http.StatusTooManyRequests {
		t.Fatalf("the right bearer token while locked out: %d, want 429", code)
	}
	now = now.Add(6 * time.Minute)
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {token}}, nil); code != http.StatusSeeOther {
		t.Fatalf("the right token after the wait: %d, want a sign-in", code)
	}
}

// A session ends at logout or SessionTTL after sign-in.
func TestConsoleSessionsExpireAndLogOut(t *testing.T) {
	f := newFixture(t)
	now := time.Now()
	console.SetNow(f.h, func() time.Time { return now })
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {token}}, nil); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	if code, _ := f.do("GET", "/console/unknown", nil, nil); code != 200 {
		t.Fatalf("signed in: %d", code)
	}
	now = now.Add(console.SessionTTL + time.Second)
	if code, _ := f.do("GET", "/console/unknown", nil, nil); code != http.StatusSeeOther {
		t.Fatalf("an expired session: %d, want a redirect to sign in", code)
	}
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {token}}, nil); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	u, _ := url.Parse(f.srv.URL + "/console/")
	cookies := f.c.Jar.Cookies(u)
	_, body := f.do("GET", "/console/unknown", nil, nil)
	m := csrfRe.FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, `id="logout"`) {
		t.Fatal("no sign-out form")
	}
	if code, _ := f.do("POST", "/console/logout", url.Values{"csrf": {m[1]}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	// The old cookie, sent again, no longer signs anyone in.
	req, _ := http.NewRequest("GET", f.srv.URL+"/console/unknown", nil)
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the cookie of a session that logged out: %d, want a redirect to sign in", resp.StatusCode)
	}
}

func TestConsoleRefusesShortTokens(t *testing.T) {
	s := memory.New(memory.Config{})
	settle := func(context.Context, string, string, int64, maintenance.Resolution) error { return nil }
	_, err := console.New(console.Config{Store: func() store.Store { return s }, Settle: settle, Addr: "0.0.0.0:9090",
		Credentials: console.Credentials{Token: strings.Repeat("x", console.MinTokenBytes-1)}})
	if err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("a 31-byte token: %v", err)
	}
}

// A customer's credential never lands in a URL: searching by it is a
// POST that leads to the tenant's records by tenant id, and a credential
// in the address is refused.
func TestConsoleCredentialSearchIsAPost(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	for i := range 60 {
		f.unknown("auth:sk_live_secret", "/v1/charges", fmt.Sprintf("k%02d", i))
	}
	if code, body := f.do("GET", "/console/?credential=sk_live_secret", nil, auth); code != http.StatusBadRequest || !strings.Contains(body, "POST") {
		t.Fatalf("credential in the address: %d", code)
	}
	code, body := f.do("GET", "/console/", nil, auth)
	m := csrfRe.FindStringSubmatch(body)
	if code != 200 || m == nil || !strings.Contains(body, `<form method="post" action="/console/"`) {
		t.Fatalf("search page: %d", code)
	}
	resp, _ := f.send("POST", "/console/", url.Values{"csrf": {m[1]}, "credential": {"sk_live_secret"}, "state": {"unknown"}},
		map[string]string{"Authorization": "Bearer " + token})
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || strings.Contains(loc, "sk_live") && !strings.Contains(loc, "auth%3Ask_live") || strings.Contains(loc, "credential") {
		t.Fatalf("credential search: %d to %q, want a redirect naming the tenant", resp.StatusCode, loc)
	}
	code, body = f.do("GET", loc, nil, auth)
	if code != 200 || strings.Count(body, ">k") != 50 || strings.Contains(body, "credential=") {
		t.Fatalf("the tenant's records: %d, %d keys\n%s", code, strings.Count(body, ">k"), body)
	}
}

// audits returns the console's audit lines (JSON objects) of action.
func (f *fixture) audits(action string) []map[string]any {
	f.t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(f.log.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber() // fences are beyond float64's integers
		if err := d.Decode(&m); err != nil {
			f.t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "idem console: "+action {
			out = append(out, m)
		}
	}
	return out
}

// actions reads idem.console.actions: the count of (action, result).
func (f *fixture) actions(action, result string) int64 {
	f.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.metrics.Collect(context.Background(), &rm); err != nil {
		f.t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "idem.console.actions" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				a, _ := dp.Attributes.Value(attribute.Key("action"))
				r, _ := dp.Attributes.Value(attribute.Key("result"))
				if a.AsString() == action && r.AsString() == result {
					return dp.Value
				}
			}
		}
	}
	return 0
}

// want checks the fields of an audit line.
func want(t *testing.T, line map[string]any, fields map[string]any) {
	t.Helper()
	for k, v := range fields {
		if fmt.Sprint(line[k]) != fmt.Sprint(v) {
			t.Errorf("audit line %q: %s = %v, want %v (line %v)", line["msg"], k, line[k], v, line)
		}
	}
}

// Every action leaves one info line saying who (the session's tag, the
// operator, the address), what (scope, key, status, reason) and the
// record's state and fence before and after, and is counted by action
// and result. Neither the token nor the session's cookie is logged.
func TestConsoleAuditTrail(t *testing.T) {
	f := newFixture(t)
	fence := f.unknown("t", "/v1/charges", "k1")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()

	if code, _ := f.do("POST", "/console/login", url.Values{"token": {"wrong-token"}}, nil); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", code)
	}
	if code, _ := f.do("GET", "/console/unknown", nil, map[string]string{"Authorization": "Bearer wrong-bearer"}); code != http.StatusUnauthorized {
		t.Fatalf("wrong bearer: %d", code)
	}
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {token}}, nil); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	logins := f.audits("login")
	if len(logins) != 3 {
		t.Fatalf("%d sign-in lines, want 3:\n%s", len(logins), f.log.String())
	}
	want(t, logins[0], map[string]any{"level": "INFO", "result": "wrong_credentials", "via": "form", "session": ""})
	want(t, logins[1], map[string]any{"result": "wrong_credentials", "via": "bearer"})
	want(t, logins[2], map[string]any{"result": "ok", "via": "form", "operator": "token"})
	session, _ := logins[2]["session"].(string)
	if len(session) < 8 || !strings.HasPrefix(fmt.Sprint(logins[0]["remote"]), "127.0.0.1:") {
		t.Fatalf("sign-in line without a session tag or remote address: %v", logins[2])
	}

	page := "/console/record?" + url.Values{"scope": {scope}, "key": {"k1"}}.Encode()
	_, body := f.do("GET", page, nil, nil)
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the record page")
	}
	act := url.Values{"csrf": {m[1]}, "scope": {scope}, "key": {"k1"}, "fence": {fmt.Sprint(fence)}, "action": {"completed"},
		"status": {"201"}, "content_type": {"application/json"}, "body": {`{"id":1}`}}
	if code, body := f.do("POST", "/console/act", act, nil); code != 200 || !strings.Contains(body, `name="reason"`) {
		t.Fatalf("confirmation page: %d, want a reason field\n%s", code, body)
	}
	if n := len(f.audits("completed")); n != 0 {
		t.Fatalf("the confirmation page left %d audit lines", n)
	}
	act.Set("confirm", "yes")
	act.Set("reason", "provider dashboard shows ch_1\ncaptured")
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusSeeOther {
		t.Fatalf("settle: %d", code)
	}
	lines := f.audits("completed")
	if len(lines) != 1 {
		t.Fatalf("%d lines for one settlement:\n%s", len(lines), f.log.String())
	}
	want(t, lines[0], map[string]any{"level": "INFO", "result": "ok", "session": session, "operator": "token",
		"scope": scope, "key": "k1", "fence": fence, "status": 201, "reason": "provider dashboard shows ch_1 captured",
		"state_before": "unknown", "fence_before": fence, "state_after": "completed", "fence_after": fence})

	// The same form again: the record is settled, refused before the store.
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusConflict {
		t.Fatalf("settling a settled record: %d", code)
	}
	lines = f.audits("completed")
	if len(lines) != 2 {
		t.Fatalf("%d lines after a refused settlement, want 2", len(lines))
	}
	want(t, lines[1], map[string]any{"result": "conflict", "state_before": "completed", "state_after": "completed"})

	// A reason is one line of at most MaxReasonBytes.
	long := "cache bust " + strings.Repeat("é", console.MaxReasonBytes)
	act = url.Values{"csrf": {m[1]}, "scope": {scope}, "key": {"k1"}, "action": {"delete"}, "confirm": {"yes"}, "reason": {long}}
	if code, _ := f.do("POST", "/console/act", act, nil); code != http.StatusSeeOther {
		t.Fatalf("delete: %d", code)
	}
	del := f.audits("delete")[0]
	want(t, del, map[string]any{"result": "ok", "state_before": "completed", "state_after": "absent"})
	if r := fmt.Sprint(del["reason"]); len(r) > console.MaxReasonBytes+len("…") || !strings.HasPrefix(r, "cache bust é") || !strings.HasSuffix(r, "é…") {
		t.Errorf("a long reason in the audit line: %d bytes, %q", len(r), r)
	}

	if code, _ := f.do("POST", "/console/logout", url.Values{"csrf": {m[1]}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	want(t, f.audits("logout")[0], map[string]any{"result": "ok", "session": session})

	for _, c := range []struct {
		action, result string
		n              int64
	}{{"login", "wrong_credentials", 2}, {"login", "ok", 1}, {"completed", "ok", 1}, {"completed", "conflict", 1},
		{"delete", "ok", 1}, {"logout", "ok", 1}} {
		if n := f.actions(c.action, c.result); n != c.n {
			t.Errorf("idem.console.actions{action=%s,result=%s} = %d, want %d", c.action, c.result, n, c.n)
		}
	}
	u, _ := url.Parse(f.srv.URL)
	for _, ck := range f.c.Jar.Cookies(u) {
		id, _, _ := strings.Cut(ck.Value, ".")
		if strings.Contains(f.log.String(), id) {
			t.Errorf("the log holds the session cookie's id %q", id)
		}
	}
	for _, secret := range []string{token, "wrong-token", "wrong-bearer"} {
		if strings.Contains(f.log.String(), secret) {
			t.Errorf("the log holds the credential %q", secret)
		}
	}
}

// The confirmation page shows the record as it is now; for a record that
// is no longer unknown it offers no settlement at all. The completed form
// has no default status, and the action refuses one left empty.
func TestConsoleConfirmShowsCurrentState(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	fence := f.unknown("t", "/v1/charges", "k1")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	_, body := f.do("GET", "/console/record?"+url.Values{"scope": {scope}, "key": {"k1"}}.Encode(), nil, auth)
	if !strings.Contains(body, `name="status" value="" size="4" required`) {
		t.Fatalf("the completed form's status is not empty and required:\n%s", body)
	}
	m := csrfRe.FindStringSubmatch(body)
	act := url.Values{"csrf": {m[1]}, "scope": {scope}, "key": {"k1"}, "fence": {fmt.Sprint(fence)}, "action": {"completed"}, "status": {""}}
	if code, body := f.do("POST", "/console/act", act, auth); code != http.StatusBadRequest || !strings.Contains(body, "no default") {
		t.Fatalf("completed without a status: %d\n%s", code, body)
	}
	act.Set("action", "not_happened")
	code, body := f.do("POST", "/console/act", act, auth)
	if code != 200 || !regexp.MustCompile(`<dl id="current">\s*<dt>State</dt><dd><span class="state unknown">`).MatchString(body) ||
		!strings.Contains(body, `id="confirm"`) || !strings.Contains(body, "upstream hung up") {
		t.Fatalf("confirmation page of an unknown record: %d\n%s", code, body)
	}
	// Settled meanwhile (another tab, the reconciler): nothing to confirm.
	if err := f.s.Resolve(context.Background(), store.ResolveParams{FenceParams: store.FenceParams{Scope: scope, Key: "k1", Fence: fence},
		To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	code, body = f.do("POST", "/console/act", act, auth)
	if code != http.StatusConflict || strings.Contains(body, `id="confirm"`) || strings.Contains(body, `name="confirm"`) ||
		!strings.Contains(body, `class="state failed_retryable"`) || !strings.Contains(body, "nothing to settle") {
		t.Fatalf("confirmation page of a settled record: %d\n%s", code, body)
	}
	if n := len(f.audits("not_happened")); n != 0 {
		t.Fatalf("an unconfirmed page left %d audit lines", n)
	}
}

// The record page of an unknown record shows the request: the summary the
// engine kept when the outcome became unknown, or an asynchronous
// request's own, credentials hidden; and why there is none when none was
// kept for this execution. With it, how long ago it started, its attempts
// and its last error.
func TestConsoleShowsTheOriginalRequest(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	ctx := context.Background()
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	reserve := func(key string) store.Record {
		res, err := f.s.Reserve(ctx, store.ReserveParams{Scope: scope, Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
		if err != nil {
			t.Fatal(err)
		}
		return res.Record
	}
	markUnknown := func(r store.Record, sum *store.PendingRequest) {
		if err := f.s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence},
			Error: "upstream hung up", Request: sum}); err != nil {
			t.Fatal(err)
		}
	}
	page := func(key string) string {
		t.Helper()
		code, body := f.do("GET", "/console/record?"+url.Values{"scope": {scope}, "key": {key}}.Encode(), nil, auth)
		if code != 200 {
			t.Fatalf("record page of %s: %d", key, code)
		}
		return html.UnescapeString(body)
	}

	r := reserve("summarised")
	markUnknown(r, &store.PendingRequest{Method: "POST", Target: "/v1/charges?expand=customer",
		Header: http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req-7"}},
		Body:   []byte(`{"amount":100,"note":"` + strings.Repeat("n", 1100)), BodyBytes: 3000, Fence: r.Fence})
	body := page("summarised")
	for _, want := range []string{"<strong>POST</strong> /v1/charges?expand=customer", "<th>X-Request-Id</th><td class=\"mono\">req-7</td>",
		"the first 1024 of 3000 bytes", `{"amount":100,"note":"nnn`, "upstream hung up", "<dt>Attempts</dt><dd>1</dd>", " ago)", "credentials and headers that may hold one are never kept"} {
		if !strings.Contains(body, want) {
			t.Errorf("the record page lacks %q", want)
		}
	}
	if strings.Contains(body, strings.Repeat("n", 1100)) {
		t.Error("the record page shows more than 1 KiB of the body")
	}

	// Swept after its holder died: nothing kept for this execution.
	if _, err := f.s.Reserve(ctx, store.ReserveParams{Scope: scope, Key: "swept", Fingerprint: "fp", Lease: time.Millisecond, TTL: time.Hour,
		LeasePolicy: store.LeaseUnknown}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // the memory store reads the real clock
	if swept, err := f.s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10}); err != nil || len(swept) != 1 {
		t.Fatalf("sweep: %d %v", len(swept), err)
	}
	if body := page("swept"); !strings.Contains(body, `Not recorded: the process that ran it stopped renewing its lease`) {
		t.Errorf("a swept record's page does not say why its request is not known:\n%s", body)
	}

	// Settled, run again, unknown again without a summary: the summary
	// of the first execution is not passed off as this one's.
	r = reserve("again")
	markUnknown(r, &store.PendingRequest{Method: "POST", Target: "/v1/charges", Fence: r.Fence})
	if err := f.s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: scope, Key: "again", Fence: r.Fence}, To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	markUnknown(reserve("again"), nil)
	if body := page("again"); !strings.Contains(body, "Not recorded: the record was marked unknown without a summary") || strings.Contains(body, `id="request"`) {
		t.Errorf("the page passes an earlier execution's request off as this one's:\n%s", body)
	}
	// Settling drops the summary (the store suite holds every store to
	// it); a summary that names another execution's fence is still never
	// shown as this one's.
	r = reserve("stale")
	markUnknown(r, &store.PendingRequest{Method: "POST", Target: "/v1/charges", Fence: r.Fence - 1})
	if body := page("stale"); !strings.Contains(body, "Not recorded: the summary kept is of an earlier execution") || strings.Contains(body, `id="request"`) {
		t.Errorf("the page passes an earlier execution's request off as this one's:\n%s", body)
	}

	// An asynchronous request is kept whole; a credential its worker
	// needs is not shown.
	q := f.s.(store.Queue)
	if _, err := q.ReservePending(ctx, store.PendingParams{ReserveParams: store.ReserveParams{Scope: scope, Key: "async", Fingerprint: "fp",
		Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown},
		Request: store.PendingRequest{Queue: "q", Method: "POST", Target: "/v1/reports", Body: []byte{0xff, 0x00, 0x01},
			Header: http.Header{"Authorization": {"Bearer sk_live_9"}, "Content-Type": {"application/octet-stream"}}}}); err != nil {
		t.Fatal(err)
	}
	claimed, err := q.Claim(ctx, store.ClaimParams{Queue: "q", Limit: 1, Lease: time.Minute})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	markUnknown(claimed[0], nil)
	body = page("async")
	for _, want := range []string{"<strong>POST</strong> /v1/reports", "kept whole", "<th>Authorization</th><td class=\"mono\"><em>(hidden", "3 bytes, binary", "ff 00 01"} {
		if !strings.Contains(body, want) {
			t.Errorf("the asynchronous record's page lacks %q", want)
		}
	}
	if strings.Contains(body, "sk_live_9") {
		t.Error("the page shows a credential")
	}

	// The queue lists attempts and age.
	if _, body := f.do("GET", "/console/unknown", nil, auth); !strings.Contains(body, "<th>Attempts</th>") || !strings.Contains(body, `<span class="ago">`) {
		t.Errorf("the unknown queue lacks attempts or age:\n%s", body)
	}
}
