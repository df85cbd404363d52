package cli

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	_ "github.com/jackc/pgx/v5/stdlib"
)

const (
	testWebhookSecret = "whsec_0123456789abcdef"
	testWebhookNext   = "whsec_fedcba9876543210"
)

// webhookStores runs f against a fresh SQLite file and a fresh PostgreSQL
// schema (skipped without IDEM_TEST_POSTGRES_URL).
func webhookStores(t *testing.T, f func(t *testing.T, dsn string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, pgdb.URL(t, testenv.PostgresURL(t)))
	})
}

// flakyAPI hangs up on the first call (the first hangUps calls, when
// set) after reading it (the outcome is unknown) and answers 201 with a
// numbered charge on the later ones.
type flakyAPI struct {
	calls   atomic.Int64
	hangUps int64
}

func (a *flakyAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	n := a.calls.Add(1)
	if n <= max(1, a.hangUps) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ch_live_%d"}`, n)
}

// sign returns an Idem-Signature value for body at time at.
func sign(at time.Time, body string, secrets ...string) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	v := "t=" + ts
	for _, s := range secrets {
		m := hmac.New(sha256.New, []byte(s))
		io.WriteString(m, ts+"."+body)
		v += ",v1=" + hex.EncodeToString(m.Sum(nil))
	}
	return v
}

// deliver posts a webhook to the proxy's admin server; sig "" sends none.
func deliver(t *testing.T, c *http.Client, admin, sig, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, admin+WebhookPath, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if sig != "" {
		req.Header.Set(WebhookSignatureHeader, sig)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("webhook: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// unknownProxyRecord starts a proxy with the webhook in front of a flakyAPI and
// makes the record of key unknown for real: the upstream hangs up after
// receiving the request.
// With hdr (an Authorization header), the proxy takes the tenant from
// Authorization; without, it serves a single tenant.
func unknownProxyRecord(t *testing.T, dsn string, key string, hdr ...string) (*Proxy, string, string, *flakyAPI) {
	t.Helper()
	return unknownAgainstAPI(t, &flakyAPI{}, dsn, key, hdr...)
}

func unknownAgainstAPI(t *testing.T, api *flakyAPI, dsn string, key string, hdr ...string) (*Proxy, string, string, *flakyAPI) {
	t.Helper()
	up := newUpstream(t, api)
	cfg := ProxyConfig{Upstream: up.URL, Store: dsn, Admin: "127.0.0.1:0", NoMaintenance: true,
		Webhook: WebhookConfig{Secrets: [][]byte{[]byte(testWebhookSecret), []byte(testWebhookNext)}}}
	if len(hdr) > 0 {
		cfg.TenantFrom, cfg.TenantSecret = []string{"authorization"}, []byte("tenant-secret-0123456789")
	}
	p, base := startProxy(t, cfg)
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges?mode=fast", key, `{"amount":7}`, hdr...); r.status != http.StatusBadGateway {
		t.Fatalf("upstream hung up: %d %s, want 502", r.status, r.body)
	}
	if r := send(t, c, "POST", base+"/v1/charges?mode=fast", key, `{"amount":7}`, hdr...); r.status != http.StatusConflict ||
		problemType(t, r) != idem.ProblemBase+"outcome-unknown" {
		t.Fatalf("retry before settlement: %d %s, want 409 outcome-unknown", r.status, r.body)
	}
	return p, base, "http://" + p.AdminAddr().String(), api
}

// fenced adds the fence the record of (scope, key) holds now to a
// delivery's JSON object: the execution the delivery is about.
func fenced(t *testing.T, p *Proxy, scope, key, body string) string {
	t.Helper()
	rec, err := p.Store().Get(context.Background(), scope, key)
	if err != nil {
		t.Fatalf("fence of %q: %v", key, err)
	}
	return fmt.Sprintf(`{"fence":%d,`, rec.Fence) + strings.TrimPrefix(body, "{")
}

// A signed "happened" settles the unknown record: the retry replays the
// settled answer without calling the upstream; the same delivery again is
// 200 (repeated), a different one 409.
func TestWebhookSettlesHappened(t *testing.T) {
	t.Parallel()
	webhookStores(t, func(t *testing.T, dsn string) {
		p, base, admin, api := unknownProxyRecord(t, dsn, "order-1", "Authorization", "Bearer sk_1")
		c := client(t)
		scope := scopeOf(tenantOf(p, "Bearer sk_1"), "POST", "/v1/charges?mode=fast")
		body := fenced(t, p, scope, "order-1", `{"key":"order-1","method":"POST","route":"/v1/charges?mode=fast",`+
			`"caller_headers":{"Authorization":"Bearer sk_1"},`+
			`"outcome":"happened","status":201,"headers":{"Content-Type":"application/json","Set-Cookie":"s=1","X-Charge":["ch_9"]},`+
			`"body":"{\"id\":\"ch_9\"}"}`)
		r := deliver(t, c, admin, sign(time.Now(), body, testWebhookSecret), body)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"state":"completed"`) || !strings.Contains(string(r.body), `"repeated":false`) {
			t.Fatalf("webhook: %d %s, want 200 completed", r.status, r.body)
		}
		for range 2 {
			r = send(t, c, "POST", base+"/v1/charges?mode=fast", "order-1", `{"amount":7}`, "Authorization", "Bearer sk_1")
			if r.status != http.StatusCreated || string(r.body) != `{"id":"ch_9"}` || r.header.Get("Idempotent-Replayed") != "true" ||
				r.header.Get("X-Charge") != "ch_9" || r.header.Get("Set-Cookie") != "" {
				t.Fatalf("retry after settlement: %d %v %s", r.status, r.header, r.body)
			}
		}
		if n := api.calls.Load(); n != 1 {
			t.Fatalf("upstream called %d times, want 1", n)
		}
		// The same answer delivered again (the provider's retry, signed
		// anew: a later timestamp), under the next secret this time.
		r = deliver(t, c, admin, sign(time.Now().Add(time.Second), body, testWebhookNext), body)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"repeated":true`) {
			t.Fatalf("repeated delivery: %d %s, want 200 repeated", r.status, r.body)
		}
		// A different answer for the settled record.
		other := strings.Replace(body, `ch_9\"`, `ch_8\"`, 1)
		r = deliver(t, c, admin, sign(time.Now(), other, testWebhookSecret), other)
		if r.status != http.StatusConflict || problemType(t, r) != idem.ProblemBase+"state-conflict" {
			t.Fatalf("conflicting delivery: %d %s, want 409 state-conflict", r.status, r.body)
		}
		notHappened := fenced(t, p, scope, "order-1", `{"key":"order-1","route":"/v1/charges?mode=fast","caller_headers":{"Authorization":"Bearer sk_1"},"outcome":"not_happened"}`)
		r = deliver(t, c, admin, sign(time.Now(), notHappened, testWebhookSecret), notHappened)
		if r.status != http.StatusConflict {
			t.Fatalf("not_happened on a completed record: %d %s, want 409", r.status, r.body)
		}
		// A delivery must name the caller when the proxy has tenants.
		anonymous := `{"key":"order-1","route":"/v1/charges?mode=fast","outcome":"not_happened"}`
		r = deliver(t, c, admin, sign(time.Now(), anonymous, testWebhookSecret), anonymous)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "caller_headers") {
			t.Fatalf("no caller: %d %s, want 400", r.status, r.body)
		}
		// Another caller's credential names another record.
		stranger := strings.Replace(body, "sk_1", "sk_2", 1)
		r = deliver(t, c, admin, sign(time.Now(), stranger, testWebhookSecret), stranger)
		if r.status != http.StatusNotFound || problemType(t, r) != idem.ProblemBase+"record-not-found" {
			t.Fatalf("another caller: %d %s, want 404", r.status, r.body)
		}
		rec, err := p.Store().Get(context.Background(), scope, "order-1")
		if err != nil || rec.State != store.StateCompleted || rec.Response.Header.Get("Set-Cookie") != "" {
			t.Fatalf("record: %+v %v", rec, err)
		}
	})
}

func tenantOf(p *Proxy, auth string) string {
	t, _ := p.callerTenant(&http.Request{Header: http.Header{"Authorization": {auth}}})
	return t
}

// "not_happened" releases the key: the next retry runs the request once,
// and later retries replay that run.
func TestWebhookNotHappenedRunsOnce(t *testing.T) {
	t.Parallel()
	webhookStores(t, func(t *testing.T, dsn string) {
		p, base, admin, api := unknownProxyRecord(t, dsn, "order-2")
		c := client(t)
		body := fenced(t, p, scopeOf("", "POST", "/v1/charges?mode=fast"), "order-2", `{"key":"order-2","route":"/v1/charges?mode=fast","outcome":"not_happened"}`)
		r := deliver(t, c, admin, sign(time.Now(), body, testWebhookSecret), body)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"state":"failed_retryable"`) {
			t.Fatalf("webhook: %d %s", r.status, r.body)
		}
		// Sent again, signed anew, before the retry: the record still says
		// so.
		r = deliver(t, c, admin, sign(time.Now().Add(-time.Minute), body, testWebhookSecret), body)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"repeated":true`) {
			t.Fatalf("repeated: %d %s", r.status, r.body)
		}
		for i := range 3 {
			r = send(t, c, "POST", base+"/v1/charges?mode=fast", "order-2", `{"amount":7}`)
			if r.status != http.StatusCreated || string(r.body) != `{"id":"ch_live_2"}` || (i > 0) != (r.header.Get("Idempotent-Replayed") == "true") {
				t.Fatalf("retry %d: %d %v %s", i, r.status, r.header, r.body)
			}
		}
		if n := api.calls.Load(); n != 2 {
			t.Fatalf("upstream called %d times, want 2 (the lost call and one run after the settlement)", n)
		}
	})
}

// Deliveries that are not signed right change nothing.
func TestWebhookRefusesBadSignatures(t *testing.T) {
	t.Parallel()
	webhookStores(t, func(t *testing.T, dsn string) {
		p, base, admin, api := unknownProxyRecord(t, dsn, "order-3")
		c := client(t)
		body := fenced(t, p, scopeOf("", "POST", "/v1/charges?mode=fast"), "order-3", `{"key":"order-3","route":"/v1/charges?mode=fast","outcome":"happened","status":201,"body":"ok"}`)
		now := time.Now()
		for name, sig := range map[string]string{
			"none":          "",
			"wrong secret":  sign(now, body, "whsec_not_the_secret_at_all"),
			"other body":    sign(now, body+" ", testWebhookSecret),
			"stale":         sign(now.Add(-6*time.Minute), body, testWebhookSecret),
			"future":        sign(now.Add(6*time.Minute), body, testWebhookSecret),
			"no timestamp":  strings.SplitN(sign(now, body, testWebhookSecret), ",", 2)[1],
			"no v1":         "t=" + strconv.FormatInt(now.Unix(), 10),
			"bad hex":       "t=" + strconv.FormatInt(now.Unix(), 10) + ",v1=zz",
			"two times":     sign(now, body, testWebhookSecret) + ",t=1",
			"huge time":     "t=99999999999999999999,v1=" + strings.Repeat("0", 64),
			"relabelled v0": strings.Replace(sign(now, body, testWebhookSecret), "v1=", "v0=", 1),
		} {
			r := deliver(t, c, admin, sig, body)
			if r.status != http.StatusUnauthorized || problemType(t, r) != idem.ProblemBase+"webhook-unauthorized" ||
				r.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: %d %s, want 401 webhook-unauthorized", name, r.status, r.body)
			}
		}
		// A wrong v1 beside the right one (a relay signing under both
		// secrets during a rotation) is accepted.
		mixed := sign(now, body, "whsec_retired_secret_000", testWebhookSecret)
		if r := deliver(t, c, admin, mixed, body); r.status != http.StatusOK {
			t.Fatalf("two v1 values, one right: %d %s", r.status, r.body)
		}
		if r := send(t, c, "POST", base+"/v1/charges?mode=fast", "order-3", `{"amount":7}`); r.status != http.StatusCreated || string(r.body) != "ok" {
			t.Fatalf("retry: %d %s", r.status, r.body)
		}
		if n := api.calls.Load(); n != 1 {
			t.Fatalf("upstream called %d times, want 1", n)
		}
	})
}

// Bodies that do not name a record or a settlement are 400; a record that
// does not exist is 404; the store's limits apply to the settled answer.
func TestWebhookBadBodies(t *testing.T) {
	t.Parallel()
	p, _, admin, _ := unknownProxyRecord(t, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "order-4")
	c := client(t)
	scope := scopeOf("", "POST", "/v1/charges?mode=fast")
	fence := fenced(t, p, scope, "order-4", "{")
	for _, tt := range []struct{ body, detail string }{
		{`{"key":"order-4","fence":0,"route":"/v1/charges?mode=fast","outcome":"not_happened"}`, `fence\" is required`},
		{`{"key":"order-4","fence":-1,"route":"/v1/charges?mode=fast","outcome":"not_happened"}`, `fence\" is required`},
		{`not json`, "unreadable"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"happened","status":201} {}`, "more than one"},
		{`{"route":"/v1/charges?mode=fast","outcome":"not_happened"}`, `key\" is required`},
		{`{"key":"order-4","outcome":"not_happened"}`, `route\"`},
		{`{"key":"order-4","route":"v1/charges","outcome":"not_happened"}`, "path and query"},
		{`{"key":"order-4","route":"/v1/charges","method":"PO ST","outcome":"not_happened"}`, "not an HTTP method"},
		{`{"key":"order-4","route":"/v1/charges","tenant":"a","caller_headers":{"Authorization":"x"},"outcome":"not_happened"}`, "not both"},
		{`{"key":"order-4","scope":"0:POST /v1/charges","route":"/v1/charges","outcome":"not_happened"}`, "not both"},
		{`{"key":"order-4","scope":"nonsense","outcome":"not_happened"}`, "not a record scope"},
		{`{"key":"order-4","route":"/v1/charges","caller_headers":{"Bad Name":"x"},"outcome":"not_happened"}`, "caller header"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"unknown"}`, "outcome"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast"}`, "outcome"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"happened"}`, "status 0"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"happened","status":201,"body":"a","body_base64":"YQ=="}`, "not both"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"happened","status":201,"body_base64":"!!"}`, "body_base64"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"happened","status":201,"headers":{"X":"a\nb"}}`, "line break"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"not_happened","status":201}`, "go with"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"run_again","body":"x"}`, "go with"},
		{`{"key":"order-4","route":"/v1/charges?mode=fast","outcome":"not_happened","provider_id":"ch_1"}`, "unknown field"},
	} {
		body := tt.body
		if !strings.Contains(body, `"fence"`) {
			body = fence + strings.TrimPrefix(body, "{")
		}
		r := deliver(t, c, admin, sign(time.Now(), body, testWebhookSecret), body)
		if r.status != http.StatusBadRequest || problemType(t, r) != idem.ProblemBase+"webhook-invalid" || !strings.Contains(string(r.body), tt.detail) {
			t.Errorf("%s: %d %s, want 400 webhook-invalid mentioning %q", tt.body, r.status, r.body, tt.detail)
		}
	}
	missing := fence + `"key":"order-404","route":"/v1/charges?mode=fast","outcome":"not_happened"}`
	if r := deliver(t, c, admin, sign(time.Now(), missing, testWebhookSecret), missing); r.status != http.StatusNotFound {
		t.Errorf("missing record: %d %s, want 404", r.status, r.body)
	}
	big := strings.Repeat("x", maxWebhookBody+1)
	if r := deliver(t, c, admin, sign(time.Now(), big, testWebhookSecret), big); r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d %s, want 413", r.status, r.body)
	}
	// A body over the engine's MaxResponseBytes is left out, as the
	// engine leaves out a live one; the raw scope names the record.
	answer := strings.Repeat("y", idem.DefaultMaxResponseBytes+1)
	body := fence + fmt.Sprintf(`"key":"order-4","scope":%q,"outcome":"happened","status":200,"body":%q}`, scope, answer)
	if r := deliver(t, c, admin, sign(time.Now(), body, testWebhookSecret), body); r.status != http.StatusOK {
		t.Fatalf("oversized answer: %d %s", r.status, r.body)
	}
	rec, err := p.Store().Get(context.Background(), scope, "order-4")
	if err != nil || rec.Response == nil || !rec.Response.BodyOmitted || len(rec.Response.Body) != 0 {
		t.Fatalf("record after an oversized answer: %+v %v", rec.Response, err)
	}
	// The same oversized answer again is the same settlement.
	if r := deliver(t, c, admin, sign(time.Now().Add(-time.Minute), body, testWebhookSecret), body); r.status != http.StatusOK || !strings.Contains(string(r.body), `"repeated":true`) {
		t.Fatalf("oversized answer repeated: %d %s", r.status, r.body)
	}
}

// Without a secret the endpoint is not served at all.
func TestWebhookOffWithoutSecret(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{})
	p, _ := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", Admin: "127.0.0.1:0"})
	c := client(t)
	body := `{"key":"k","route":"/v1/charges","outcome":"not_happened"}`
	if r := deliver(t, c, "http://"+p.AdminAddr().String(), sign(time.Now(), body, testWebhookSecret), body); r.status != http.StatusNotFound {
		t.Fatalf("webhook without a secret: %d %s, want 404 (not served)", r.status, r.body)
	}
	if _, err := NewProxy(context.Background(), ProxyConfig{Upstream: up.URL, Store: "memory:", Listen: "127.0.0.1:0", SingleTenant: true,
		Webhook: WebhookConfig{Secrets: [][]byte{[]byte(testWebhookSecret)}}}); err == nil || !strings.Contains(err.Error(), "--admin") {
		t.Fatalf("webhook without an admin server: %v", err)
	}
}

// A store that fails answers 503 and settles nothing.
func TestWebhookStoreDown(t *testing.T) {
	t.Parallel()
	p, _, admin, _ := unknownProxyRecord(t, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "order-5")
	c := client(t)
	// Closing the store under the running proxy is what an outage looks
	// like to the handler; Serve's own Close at the end reports nothing
	// new for SQLite.
	body := fenced(t, p, scopeOf("", "POST", "/v1/charges?mode=fast"), "order-5", `{"key":"order-5","route":"/v1/charges?mode=fast","outcome":"not_happened"}`)
	p.Store().Close()
	r := deliver(t, c, admin, sign(time.Now(), body, testWebhookSecret), body)
	if r.status != http.StatusServiceUnavailable || problemType(t, r) != idem.ProblemBase+"store-unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("store down: %d %v %s, want 503", r.status, r.header, r.body)
	}
}

func TestParseWebhookFlags(t *testing.T) {
	dir := t.TempDir()
	two := filepath.Join(dir, "two")
	os.WriteFile(two, []byte(testWebhookSecret+"\n"+testWebhookNext+"\n"), 0o600)
	three := filepath.Join(dir, "three")
	os.WriteFile(three, []byte(testWebhookSecret+"\n"+testWebhookNext+"\nwhsec_third_secret_xxxx\n"), 0o600)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	base := []string{"--upstream", "http://127.0.0.1:1", "--admin", "127.0.0.1:0"}

	cfg, _, _, err := parseProxyFlags(append(base, "--webhook-secret-file", two, "--webhook-tolerance", "1m"), io.Discard)
	if err != nil || len(cfg.Webhook.Secrets) != 2 || string(cfg.Webhook.Secrets[1]) != testWebhookNext || cfg.Webhook.Tolerance != time.Minute {
		t.Fatalf("two secrets: %+v %v", cfg.Webhook, err)
	}
	cfg, _, _, err = parseProxyFlags(base, io.Discard)
	if err != nil || len(cfg.Webhook.Secrets) != 0 || cfg.Webhook.Tolerance != DefaultWebhookTolerance {
		t.Fatalf("no secret: %+v %v", cfg.Webhook, err)
	}
	t.Setenv(webhookSecretEnv, testWebhookSecret)
	cfg, _, _, err = parseProxyFlags(base, io.Discard)
	if err != nil || len(cfg.Webhook.Secrets) != 1 || string(cfg.Webhook.Secrets[0]) != testWebhookSecret {
		t.Fatalf("secret from the environment: %+v %v", cfg.Webhook, err)
	}
	for name, args := range map[string][]string{
		"three secrets":   append(base, "--webhook-secret-file", three),
		"short secret":    append(base, "--webhook-secret-file", short),
		"empty file":      append(base, "--webhook-secret-file", empty),
		"no admin":        {"--upstream", "http://127.0.0.1:1"},
		"zero tolerance":  append(base, "--webhook-tolerance", "0s"),
		"missing file":    append(base, "--webhook-secret-file", filepath.Join(dir, "nope")),
		"negative tolera": append(base, "--webhook-tolerance", "-1m"),
	} {
		if _, _, _, err := parseProxyFlags(args, io.Discard); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A captured delivery releases one execution only. The request times out
// upstream (unknown); a signed not_happened releases it; the retry runs it
// and it times out again (unknown, a new fence); the same captured
// delivery sent again, and the same body signed anew, release nothing: the
// retry is still refused, and the upstream ran twice, not three times.
func TestWebhookReplayDoesNotReleaseTheNextExecution(t *testing.T) {
	t.Parallel()
	webhookStores(t, func(t *testing.T, dsn string) {
		api := &flakyAPI{hangUps: 2}
		p, base, admin, _ := unknownAgainstAPI(t, api, dsn, "order-r")
		c := client(t)
		scope := scopeOf("", "POST", "/v1/charges?mode=fast")
		body := fenced(t, p, scope, "order-r", `{"key":"order-r","route":"/v1/charges?mode=fast","outcome":"not_happened"}`)
		captured := sign(time.Now(), body, testWebhookSecret)
		if r := deliver(t, c, admin, captured, body); r.status != http.StatusOK || !strings.Contains(string(r.body), `"repeated":false`) {
			t.Fatalf("first delivery: %d %s", r.status, r.body)
		}
		if r := send(t, c, "POST", base+"/v1/charges?mode=fast", "order-r", `{"amount":7}`); r.status != http.StatusBadGateway {
			t.Fatalf("retry after the release: %d %s, want 502 (the upstream hung up again)", r.status, r.body)
		}
		second, err := p.Store().Get(context.Background(), scope, "order-r")
		if err != nil || second.State != store.StateUnknown {
			t.Fatalf("after the second run: %+v %v", second, err)
		}
		r := deliver(t, c, admin, captured, body)
		if r.status != http.StatusConflict || problemType(t, r) != idem.ProblemBase+"webhook-replayed" {
			t.Fatalf("the captured delivery again: %d %s, want 409 webhook-replayed", r.status, r.body)
		}
		r = deliver(t, c, admin, sign(time.Now().Add(-time.Minute), body, testWebhookSecret), body)
		if r.status != http.StatusConflict || problemType(t, r) != idem.ProblemBase+"settlement-stale" ||
			!strings.Contains(string(r.body), fmt.Sprint(second.Fence)) {
			t.Fatalf("the first execution's settlement signed anew: %d %s, want 409 settlement-stale naming the new fence", r.status, r.body)
		}
		if rec, _ := p.Store().Get(context.Background(), scope, "order-r"); rec.State != store.StateUnknown || rec.Fence != second.Fence {
			t.Fatalf("after the refused deliveries: %s fence %d, want unknown fence %d", rec.State, rec.Fence, second.Fence)
		}
		if r := send(t, c, "POST", base+"/v1/charges?mode=fast", "order-r", `{"amount":7}`); r.status != http.StatusConflict ||
			problemType(t, r) != idem.ProblemBase+"outcome-unknown" {
			t.Fatalf("retry after the refused deliveries: %d %s, want 409 outcome-unknown", r.status, r.body)
		}
		if n := api.calls.Load(); n != 2 {
			t.Fatalf("upstream called %d times, want 2", n)
		}
		// A settlement about the second execution is taken.
		now := fenced(t, p, scope, "order-r", `{"key":"order-r","route":"/v1/charges?mode=fast","outcome":"not_happened"}`)
		if r := deliver(t, c, admin, sign(time.Now(), now, testWebhookSecret), now); r.status != http.StatusOK {
			t.Fatalf("settling the second execution: %d %s", r.status, r.body)
		}
		if r := send(t, c, "POST", base+"/v1/charges?mode=fast", "order-r", `{"amount":7}`); r.status != http.StatusCreated {
			t.Fatalf("retry after settling the second execution: %d %s", r.status, r.body)
		}
	})
}

// A delivery refused because nothing was decided (the store is down) may
// come again as it was: its signature is not kept.
func TestWebhookReplayCacheForgetsUndecided(t *testing.T) {
	t.Parallel()
	var c replayCache
	now := time.Unix(1_000_000, 0)
	if !c.add("a", now.Add(time.Minute), now) || c.add("a", now.Add(time.Minute), now.Add(59*time.Second)) {
		t.Fatal("a signature was taken twice within its tolerance")
	}
	c.forget("a")
	if !c.add("a", now.Add(time.Minute), now) {
		t.Fatal("a forgotten signature was refused")
	}
	// Past its time the entry goes at the next pruning.
	for i := range 200 {
		c.add(fmt.Sprint(i), now.Add(time.Minute), now.Add(2*time.Minute))
	}
	if _, ok := c.until["a"]; ok {
		t.Fatal("an expired signature was kept")
	}
}

// During a rotation a sender signs each delivery under both secrets. A
// captured delivery sent again is refused whichever of its signatures it
// carries: the delivery is its timestamp and body, not the signature that
// matched (with only its second signature, it used to be taken again).
func TestWebhookReplayUnderTheOtherSignature(t *testing.T) {
	t.Parallel()
	p, _, admin, _ := unknownProxyRecord(t, "memory:", "order-x")
	c := client(t)
	body := fenced(t, p, scopeOf("", "POST", "/v1/charges?mode=fast"), "order-x",
		`{"key":"order-x","route":"/v1/charges?mode=fast","outcome":"not_happened"}`)
	both := sign(time.Now(), body, testWebhookSecret, testWebhookNext)
	if r := deliver(t, c, admin, both, body); r.status != http.StatusOK {
		t.Fatalf("first delivery: %d %s", r.status, r.body)
	}
	parts := strings.Split(both, ",") // t=..., v1=first, v1=second
	for name, sig := range map[string]string{"both": both, "the first": parts[0] + "," + parts[1], "the second": parts[0] + "," + parts[2]} {
		if r := deliver(t, c, admin, sig, body); r.status != http.StatusConflict || problemType(t, r) != idem.ProblemBase+"webhook-replayed" {
			t.Errorf("the delivery again with %s signature: %d %s, want 409 webhook-replayed", name, r.status, r.body)
		}
	}
}
