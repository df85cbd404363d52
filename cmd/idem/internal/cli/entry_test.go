package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// A trusted header can never name a credential's tenant: a caller without
// Authorization that sends X-Tenant: auth:<hex> (the victim's tenant id,
// which /metrics labels show) is refused with 400, whatever the case of the
// prefix; the victim's answer is not replayed and its key cannot be probed.
// Mixing the sources is warned about at start.
func TestTrustedHeaderCannotBorrowACredentialTenant(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	up := newUpstream(t, api)
	var logs safeBuffer
	p, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "sqlite:" + filepath.Join(t.TempDir(), "idem.db"),
		TenantFrom: []string{"authorization", "trusted-header:X-Tenant"}, TenantSecret: []byte("tenant-secret-0123456789"),
		Logger: logs.logger()})
	if !strings.Contains(logs.String(), "trusted tenant header is a source beside credentials") {
		t.Errorf("no warning at start for mixed sources:\n%s", logs.String())
	}
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "k1", `{"amount":1}`, "Authorization", "Bearer victim"); r.status != http.StatusCreated {
		t.Fatalf("victim: %d %s", r.status, r.body)
	}
	victim := tenantOf(p, "Bearer victim")
	if !strings.HasPrefix(victim, "auth:") {
		t.Fatalf("victim's tenant %q", victim)
	}
	for _, forged := range []string{victim, strings.ToUpper(victim[:5]) + victim[5:], "header:x-api-key:00", "Cookie:session:00"} {
		for _, body := range []string{`{"amount":1}`, `{"amount":2}`} {
			r := send(t, c, "POST", base+"/v1/charges", "k1", body, "X-Tenant", forged)
			if r.status != http.StatusBadRequest || problemType(t, r) != idem.ProblemBase+"tenant-invalid" {
				t.Fatalf("X-Tenant: %s with body %s: %d %s, want 400 tenant-invalid", forged, body, r.status, r.body)
			}
		}
	}
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
	// A plain trusted value is a tenant of its own.
	if r := send(t, c, "POST", base+"/v1/charges", "k1", `{"amount":1}`, "X-Tenant", "acme"); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("trusted tenant acme: %d %v %s", r.status, r.header, r.body)
	}
}

// An asynchronous request keeps none of its tenant-source credentials in
// the store (the header:NAME header; Authorization and Cookie never),
// unless --async-keep-headers names them.
func TestAsyncStoresNoTenantCredential(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		_, up := newReportAPI(t)
		cfg := ProxyConfig{Upstream: up, Store: "sqlite:" + filepath.Join(t.TempDir(), "idem.db"), Async: []string{"POST /v1/reports"},
			TenantFrom: []string{"header:X-Api-Key", "cookie:session"}, TenantSecret: []byte("tenant-secret-0123456789")}
		if keep {
			cfg.AsyncKeepHeaders = []string{"x-api-key"}
		}
		p, base := startProxy(t, cfg) // no worker: the request stays pending
		c := client(t)
		wantProxyAccepted(t, send(t, c, "POST", base+"/v1/reports", "k", `{}`, "X-Api-Key", "key_live_1", "X-Other", "kept"), "api key")
		wantProxyAccepted(t, send(t, c, "POST", base+"/v1/reports", "k2", `{}`, "Cookie", "session=s_1"), "cookie")
		recs, err := p.Store().(store.Queue).Claim(context.Background(), store.ClaimParams{Queue: asyncQueue, Limit: 10, Lease: time.Minute})
		if err != nil || len(recs) != 2 {
			t.Fatalf("claim: %d %v", len(recs), err)
		}
		for _, rec := range recs {
			h := rec.Request.Header
			if h.Get("Cookie") != "" {
				t.Errorf("keep %v: the stored request of %s holds the session cookie", keep, rec.Key)
			}
			if rec.Key != "k" {
				continue
			}
			if h.Get("X-Other") != "kept" {
				t.Errorf("keep %v: an ordinary header was not kept: %v", keep, h)
			}
			if got := h.Get("X-Api-Key"); (got == "key_live_1") != keep {
				t.Errorf("keep %v: the stored request's X-Api-Key is %q", keep, got)
			}
		}
	}
}

// countingBody is a request body of n bytes that counts what was read.
type countingBody struct {
	left, read int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	n = min(n, b.left)
	b.left -= n
	b.read += n
	return int(n), nil
}

func (b *countingBody) Close() error { return nil }

// blockingBody says when it is first read, and delivers no byte until
// released.
type blockingBody struct {
	started chan<- struct{}
	release <-chan struct{}
	once    sync.Once
}

func (b *blockingBody) Read(p []byte) (int, error) {
	b.once.Do(func() { b.started <- struct{}{} })
	<-b.release
	return 0, io.EOF
}

func (b *blockingBody) Close() error { return nil }

// A webhook post without a well-formed, fresh signature header costs no
// body byte: 12 unsigned 16 MiB posts read nothing. Bodies whose signature
// is still to be checked are bounded for the whole process: while two of
// the largest are being read, a third is refused (503) before reading.
func TestWebhookReadsNothingBeforeTheSignatureHeader(t *testing.T) {
	t.Parallel()
	p := &Proxy{log: discardLogger()}
	handlers, err := p.mountWebhook(nil)
	if err != nil || len(handlers) != 0 {
		t.Fatalf("no secret: %v %v", handlers, err)
	}
	p.cfg.Webhook = WebhookConfig{Secrets: [][]byte{[]byte(testWebhookSecret)}}
	handlers, err = p.mountWebhook(nil)
	if err != nil {
		t.Fatal(err)
	}
	h := handlers["POST "+WebhookPath]
	now := time.Now()
	for name, sig := range map[string]string{
		"none":      "",
		"malformed": "v1=" + strings.Repeat("0", 64),
		"stale":     sign(now.Add(-time.Hour), "x", testWebhookSecret),
		"huge":      "t=" + strconv.FormatInt(now.Unix(), 10) + strings.Repeat(",v1="+strings.Repeat("0", 64), 40),
	} {
		var wg sync.WaitGroup
		bodies := make([]*countingBody, 12)
		for i := range bodies {
			bodies[i] = &countingBody{left: maxWebhookBody}
			wg.Go(func() {
				req := httptest.NewRequest(http.MethodPost, WebhookPath, nil)
				req.Body, req.ContentLength = bodies[i], maxWebhookBody
				if sig != "" {
					req.Header.Set(WebhookSignatureHeader, sig)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusUnauthorized || w.Header().Get("Connection") != "close" {
					t.Errorf("%s: %d %v, want 401 closing the connection", name, w.Code, w.Header())
				}
			})
		}
		wg.Wait()
		for _, b := range bodies {
			if b.read != 0 {
				t.Fatalf("%s: %d body bytes read before the signature header was checked", name, b.read)
			}
		}
	}
	// Two of the largest bodies being read (stalled) hold the budget: a
	// third is refused without a byte read; once they end, it is taken.
	fresh := sign(now, "{}", "whsec_wrong_secret_00000")
	started, release := make(chan struct{}, 2), make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, WebhookPath, nil)
			req.Body, req.ContentLength = &blockingBody{started: started, release: release}, maxWebhookBody
			req.Header.Set(WebhookSignatureHeader, fresh)
			h.ServeHTTP(httptest.NewRecorder(), req)
		})
	}
	<-started
	<-started
	third := &countingBody{left: maxWebhookBody}
	req := httptest.NewRequest(http.MethodPost, WebhookPath, nil)
	req.Body, req.ContentLength = third, maxWebhookBody
	req.Header.Set(WebhookSignatureHeader, fresh)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusServiceUnavailable || third.read != 0 || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a third large body while two are read: %d after reading %d bytes, Retry-After %q; want 503 before reading", w.Code, third.read, w.Header().Get("Retry-After"))
	}
	close(release)
	wg.Wait()
	req = httptest.NewRequest(http.MethodPost, WebhookPath, nil)
	req.Body, req.ContentLength = &countingBody{left: maxWebhookBody}, maxWebhookBody
	req.Header.Set(WebhookSignatureHeader, fresh)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("after the stalled bodies ended: %d, want 401 (read and checked)", w.Code)
	}
}

// The admin server has the main listener's limits: a connection stalled
// in its body is cut off after --body-timeout, and headers over
// --max-header-bytes are refused.
func TestAdminServerLimits(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{})
	p, _ := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", Admin: "127.0.0.1:0", BodyTimeout: 300 * time.Millisecond,
		MaxHeaderBytes: 4 << 10, Webhook: WebhookConfig{Secrets: [][]byte{[]byte(testWebhookSecret)}}})
	admin := p.AdminAddr().String()
	conn, err := net.Dial("tcp", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n%s: %s\r\n\r\n{\"key\":",
		WebhookPath, admin, WebhookSignatureHeader, sign(time.Now(), "whatever", testWebhookSecret))
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, conn) // returns when the server closes the connection
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a connection stalled in its body stayed open %v", d)
	}
	c := client(t)
	req, _ := http.NewRequest(http.MethodGet, "http://"+admin+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 8<<10))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("admin request with 8 KiB of headers: %d, want 431", resp.StatusCode)
	}
}

// A refusal always says why: every configuration idem proxy refuses
// prints its reason, exit status 2.
func TestProxyRefusalsSayWhy(t *testing.T) {
	t.Setenv(tenantSecretEnv, "tenant-secret-0123456789")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "redis://127.0.0.1:6379/0", "--tenant-from", "authorization", "--tenant-max-active", "5"}, "--tenant-max-active needs a store that counts"},
		{[]string{"--store", "redis://127.0.0.1:6379/0", "--tenant-from", "authorization", "--store-max-active", "5"}, "--store-max-active needs a store that counts"},
		{[]string{"--store", "memory:", "--single-tenant", "--store-conns", "-5"}, "--store-conns must be 0"},
		{[]string{"--store", "memory:", "--single-tenant", "--log-format", "xml"}, "xml"},
	} {
		args := append([]string{"proxy", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"}, tc.args...)
		_, errOut, err := run(args...)
		if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: %v, stderr %q; want a usage error saying %q", tc.args, err, errOut, tc.want)
		}
	}
	// A library user gets the same refusal from NewProxy: the store would
	// never open.
	_, err := NewProxy(context.Background(), ProxyConfig{Upstream: "http://127.0.0.1:1", Listen: "127.0.0.1:0", Store: "memory:", SingleTenant: true, StoreConns: -5})
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--store-conns -5") {
		t.Fatalf("NewProxy with StoreConns -5: %v", err)
	}
}

// A webhook names the key as the client sent it: quoted ("w1", the IETF
// header's form) or bare, like the console and the commands.
func TestWebhookQuotedKey(t *testing.T) {
	t.Parallel()
	p, base, admin, api := unknownProxyRecord(t, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "w1")
	c := client(t)
	body := fenced(t, p, scopeOf("", "POST", "/v1/charges?mode=fast"), "w1", `{"key":"\"w1\"","route":"/v1/charges?mode=fast","outcome":"happened","status":201,"body":"settled"}`)
	if r := deliver(t, c, admin, sign(time.Now(), body, testWebhookSecret), body); r.status != http.StatusOK || !strings.Contains(string(r.body), `"key":"w1"`) {
		t.Fatalf("quoted key: %d %s", r.status, r.body)
	}
	if r := send(t, c, "POST", base+"/v1/charges?mode=fast", "w1", `{"amount":7}`); r.status != http.StatusCreated || string(r.body) != "settled" {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times", n)
	}
	bad := fenced(t, p, scopeOf("", "POST", "/v1/charges?mode=fast"), "w1", `{"key":"\"w1","route":"/v1/charges?mode=fast","outcome":"not_happened"}`)
	if r := deliver(t, c, admin, sign(time.Now(), bad, testWebhookSecret), bad); r.status != http.StatusBadRequest {
		t.Fatalf("unterminated quoted key: %d %s, want 400", r.status, r.body)
	}
}

// The SQLite store's generated tenant secret is never made anew for a
// database that holds records (their tenants were hashed under the lost
// one: a new secret would run every stored request again); a secret file
// others can read is warned about; the database is the owner's only.
func TestTenantSecretNotRemadeForRecords(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "idem.db")
	api := &chargeAPI{}
	cfg := ProxyConfig{Upstream: newUpstream(t, api).URL, Store: "sqlite:" + db, TenantFrom: []string{"authorization"}}
	_, base, stop := startStoppable(t, cfg)
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "k", `{}`, "Authorization", "Bearer alice"); r.status != http.StatusCreated {
		t.Fatalf("first run: %d", r.status)
	}
	stop()
	c.CloseIdleConnections()
	for _, name := range []string{db, db + "-wal", db + "-shm", db + ".tenant-secret"} {
		if fi, err := os.Stat(name); err == nil && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
	secret := db + ".tenant-secret"
	// Readable by others: started, with a warning.
	if err := os.Chmod(secret, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs safeBuffer
	cfg.Logger = logs.logger()
	_, _, stop = startStoppable(t, cfg)
	stop()
	if !strings.Contains(logs.String(), "readable by other users") {
		t.Errorf("no warning for a secret file readable by others:\n%s", logs.String())
	}
	// Lost: refused, saying how to restore it, and no new secret is made.
	if err := os.Remove(secret); err != nil {
		t.Fatal(err)
	}
	_, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: cfg.Upstream, Store: cfg.Store,
		TenantFrom: cfg.TenantFrom, Logger: discardLogger()})
	if err == nil || !strings.Contains(err.Error(), "restore "+secret) || !strings.Contains(err.Error(), "--tenant-secret-file") {
		t.Fatalf("restart without the secret: %v", err)
	}
	if _, err := os.Stat(secret); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a new secret was made: %v", err)
	}
	if api.calls.Load() != 1 {
		t.Fatalf("upstream calls %d", api.calls.Load())
	}
}

// Spraying fresh credentials: 40 requests, each with a new X-Api-Key (a
// new tenant each) and a new key. The per-tenant rate sees one key per
// tenant; --new-key-rate bounds them all: past its burst they get 429
// new-keys-limited with Retry-After and nothing is stored or forwarded.
// The upstream's 401 for an unknown credential is stored like any 4xx
// answer (a retry replays it), also under a tenant that never had a 2xx:
// what bounds a sprayer's records is the rate, not a special case.
func TestNewKeyRateBoundsCredentialSpraying(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	p, base := startProxy(t, ProxyConfig{
		Upstream:     up.URL,
		Store:        "sqlite:" + filepath.Join(t.TempDir(), "idem.db"),
		TenantFrom:   []string{"header:X-Api-Key"},
		TenantSecret: []byte("tenant-secret-0123456789"),
		Config:       idem.Config{TenantRate: 5, NewKeyRate: 1, NewKeyBurst: 10},
	})
	c := client(t)
	var stored, limited int
	for i := range 40 {
		r := send(t, c, "POST", base+"/v1/charges", fmt.Sprint("spray-", i), `{}`, "X-Api-Key", fmt.Sprint("junk-", i))
		switch {
		case r.status == http.StatusUnauthorized:
			stored++
		case r.status == http.StatusTooManyRequests && problemType(t, r) == idem.ProblemBase+idem.SlugNewKeysLimited && r.header.Get("Retry-After") != "":
			limited++
		default:
			t.Fatalf("spray %d: %d %v %s", i, r.status, r.header, r.body)
		}
	}
	if stored > 12 || limited < 28 || int64(stored) != calls.Load() {
		t.Fatalf("40 sprayed credentials: %d answered (%d upstream calls), %d refused; want at most the burst (10, plus refill) through", stored, calls.Load(), limited)
	}
	// The stored 401 replays.
	r := send(t, c, "POST", base+"/v1/charges", "spray-0", `{}`, "X-Api-Key", "junk-0")
	if r.status != http.StatusUnauthorized || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a sprayed request: %d %v", r.status, r.header)
	}
	recs, _, err := p.Store().List(context.Background(), store.ListParams{Limit: 100})
	if err != nil || len(recs) != stored {
		t.Fatalf("records: %d %v, want %d", len(recs), err, stored)
	}
}

// The replay cache's settings are refused where the store would ignore
// them: a proxy that starts has the cache it was told to have.
func TestProxyRefusesReplayCacheSettingsItWouldIgnore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  ProxyConfig
		want string
	}{
		{ProxyConfig{Store: "sqlite:" + filepath.Join(t.TempDir(), "idem.db"), StoreReplayCache: 64 << 20}, "--store-replay-cache needs a PostgreSQL store"},
		{ProxyConfig{Store: "redis://127.0.0.1:1/0", StoreReplayCache: 64 << 20}, "--store-replay-cache needs a PostgreSQL store"},
		{ProxyConfig{Store: "postgres://idem@127.0.0.1:1/idem", StoreListen: "postgres://idem@127.0.0.1:1/idem"}, "--store-listen needs --store-replay-cache"},
	} {
		tc.cfg.Upstream, tc.cfg.Listen, tc.cfg.SingleTenant = "http://127.0.0.1:1", "127.0.0.1:0", true
		tc.cfg.Logger = slog.New(slog.DiscardHandler)
		p, err := NewProxy(context.Background(), tc.cfg)
		if err == nil {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			p.Serve(ctx)
		}
		if !errors.Is(err, ErrUsage) || !strings.Contains(fmt.Sprint(err), tc.want) {
			t.Errorf("%s with replay cache %d, listen %q: %v; want a usage error saying %q", tc.cfg.Store, tc.cfg.StoreReplayCache, tc.cfg.StoreListen, err, tc.want)
		}
	}
}
