package cli

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
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
