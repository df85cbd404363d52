package console_test

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

type fixture struct {
	t   *testing.T
	s   store.Store
	srv *httptest.Server
	c   *http.Client
}

func newFixture(t *testing.T) *fixture {
	s := memory.New(memory.Config{})
	m, err := maintenance.New(s, maintenance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := console.New(console.Config{Store: func() store.Store { return s }, Settle: m.Settle,
		Tenant:      func(c string) (string, error) { return "auth:" + c, nil },
		Credentials: console.Credentials{Token: "s3cret"}, Addr: "0.0.0.0:9090"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &fixture{t: t, s: s, srv: srv, c: c}
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
	return resp.StatusCode, string(b)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

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
	if code, body := f.do("GET", "/console/unknown", nil, map[string]string{"Authorization": "Bearer s3cret"}); code != 200 || !strings.Contains(body, "k2") {
		t.Fatalf("bearer token: %d", code)
	}
	if code, _ := f.do("POST", "/console/login", url.Values{"token": {"s3cret"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}

	// Search by credential (hashed by the proxy's function) and by the key
	// as the client sent it, quoted.
	code, body := f.do("GET", "/console/?"+url.Values{"credential": {"abc"}, "key": {`"k-<script>alert(1)</script>"`}}.Encode(), nil, nil)
	if code != 200 || strings.Contains(body, "<script>alert") || !strings.Contains(body, "k-&lt;script&gt;") || strings.Contains(body, "k2") {
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
	f.unknown(tenant, route, key)
	scope := (&idem.Request{Tenant: tenant, Method: "POST", Route: route}).Scope()
	if err := f.s.Defer(context.Background(), store.DeferParams{Scope: scope, Key: key, DeadLetter: true,
		Error: "resolver kept failing"}); err != nil {
		f.t.Fatal(err)
	}
	return scope
}

func TestConsoleDeadLetters(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer s3cret"}
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
	req, _ := http.NewRequest("POST", f.srv.URL+"/console/act", strings.NewReader(act.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := f.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
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
	auth := map[string]string{"Authorization": "Bearer s3cret"}
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

// A settlement from a page that showed one execution is refused once the
// record ran again (released, run, unknown again): 409, nothing changed.
func TestConsoleSettlementBoundToFence(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer s3cret"}
	first := f.unknown("t", "/v1/charges", "k")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	_, body := f.do("GET", "/console/record?"+url.Values{"scope": {scope}, "key": {"k"}}.Encode(), nil, auth)
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the record page")
	}
	act := url.Values{"csrf": {m[1]}, "scope": {scope}, "key": {"k"}, "fence": {fmt.Sprint(first)}, "action": {"not_happened"}, "confirm": {"yes"}}
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
