package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// --tenant-rate and --tenant-max-active: 429 with a problem of their own,
// nothing forwarded; replays are free; answers name the key's expiry.
func TestProxyTenantLimits(t *testing.T) {
	t.Parallel()
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--tenant-rate", "0.001", "--tenant-burst", "3",
		"--tenant-max-active", "1", "--tenant-from", "trusted-header:X-Tenant"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TenantRate != 0.001 || cfg.TenantBurst != 3 || cfg.TenantMaxActive != 1 {
		t.Fatalf("parsed %v %v %v", cfg.TenantRate, cfg.TenantBurst, cfg.TenantMaxActive)
	}
	release := make(chan struct{})
	var once sync.Once
	held := make(chan struct{})
	api := &chargeAPI{}
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/slow" {
			once.Do(func() { close(held) })
			<-release
		}
		api.ServeHTTP(w, r)
	}))
	cfg.Store, cfg.Upstream = "sqlite:"+t.TempDir()+"/idem.db", up.URL
	_, base := startProxy(t, cfg)
	c := client(t)

	first := send(t, c, "POST", base+"/v1/charges", "k1", `{}`, "X-Tenant", "acme")
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d", first.status)
	}
	exp, err := http.ParseTime(first.header.Get(idem.ExpiresHeader))
	if err != nil || exp.Before(time.Now().Add(23*time.Hour)) {
		t.Fatalf("%s %q on the first answer: %v", idem.ExpiresHeader, first.header.Get(idem.ExpiresHeader), err)
	}
	replay := send(t, c, "POST", base+"/v1/charges", "k1", `{}`, "X-Tenant", "acme")
	if replay.header.Get(idem.ExpiresHeader) != first.header.Get(idem.ExpiresHeader) {
		t.Fatalf("the replay names another expiry: %q", replay.header.Get(idem.ExpiresHeader))
	}

	// The second token holds a key in flight: the tenant is at its cap
	// (and the refused call gives its token back).
	done := make(chan reply)
	go func() { done <- send(t, c, "POST", base+"/v1/slow", "k2", `{}`, "X-Tenant", "acme") }()
	<-held
	over := send(t, c, "POST", base+"/v1/charges", "k3", `{}`, "X-Tenant", "acme")
	if over.status != http.StatusTooManyRequests || !strings.Contains(string(over.body), idem.SlugOverCap) || over.header.Get("Retry-After") == "" {
		t.Fatalf("at the cap: %d %s", over.status, over.body)
	}
	close(release)
	if r := <-done; r.status != http.StatusCreated {
		t.Fatalf("held request: %d", r.status)
	}
	// The third token, then none left: the rate refuses a new key, but
	// not a replay.
	if r := send(t, c, "POST", base+"/v1/charges", "k4", `{}`, "X-Tenant", "acme"); r.status != http.StatusCreated {
		t.Fatalf("third token: %d %s", r.status, r.body)
	}
	limited := send(t, c, "POST", base+"/v1/charges", "k5", `{}`, "X-Tenant", "acme")
	if limited.status != http.StatusTooManyRequests || !strings.Contains(string(limited.body), idem.SlugRateLimited) {
		t.Fatalf("over the rate: %d %s", limited.status, limited.body)
	}
	if r := send(t, c, "POST", base+"/v1/charges", "k1", `{}`, "X-Tenant", "acme"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a replay over the rate: %d", r.status)
	}
	if r := send(t, c, "POST", base+"/v1/charges", "k1", `{}`, "X-Tenant", "globex"); r.status != http.StatusCreated {
		t.Fatalf("another tenant: %d", r.status)
	}
	if n := api.calls.Load(); n != 4 {
		t.Fatalf("upstream called %d times, want 4", n)
	}
}

func TestProxyProtectionFlags(t *testing.T) {
	t.Parallel()
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x"}, io.Discard)
	if err != nil || cfg.BreakerFailures != 5 || cfg.BreakerOpen != time.Second || cfg.BreakerMaxOpen != 30*time.Second ||
		cfg.TenantRate != 0 || cfg.TenantMaxActive != 0 || cfg.StoreActiveRecount != idem.DefaultStoreActiveRecount {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}
	cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://x", "--breaker-failures", "0"}, io.Discard)
	if err != nil || cfg.BreakerFailures >= 0 {
		t.Fatalf("--breaker-failures 0 must turn the breaker off: %d %v", cfg.BreakerFailures, err)
	}
	for _, bad := range [][]string{
		{"--tenant-rate", "-1"}, {"--tenant-max-active", "-2"}, {"--tenant-burst", "-1"}, {"--store-max-active", "-1"}, {"--store-active-recount", "0s"}, {"--store-active-recount", "-1s"},
		{"--breaker-failures", "-1"}, {"--breaker-open", "0s"}, {"--breaker-open", "1m", "--breaker-max-open", "1s"},
	} {
		if _, _, _, err := parseProxyFlags(append([]string{"--upstream", "http://x"}, bad...), io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// A Redis store cannot count a tenant's records: the proxy refuses
// --tenant-max-active over it (before reaching it) instead of running
// without the cap.
func TestProxyTenantCapNeedsACountingStore(t *testing.T) {
	t.Parallel()
	_, err := NewProxy(context.Background(), ProxyConfig{
		Upstream:     "http://x",
		Store:        "redis://127.0.0.1:1/0",
		Listen:       "127.0.0.1:0",
		SingleTenant: true,
		TenantSecret: []byte("s"),
		Config:       idem.Config{TenantMaxActive: 3},
	})
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--tenant-max-active") {
		t.Fatalf("--tenant-max-active over redis: %v", err)
	}
}

// --store-max-active needs no tenant: a client that sends a fresh
// credential with every request (a new tenant each time) holds at most
// the bound in flight; past it 503 over-capacity with Retry-After, nothing
// forwarded, while a duplicate of a held key is still answered. On
// PostgreSQL the proxy keeps the index the count needs (TenantCap).
func TestProxyStoreBoundAgainstFreshCredentials(t *testing.T) {
	t.Parallel()
	webhookStores(t, testProxyStoreBound)
}

func testProxyStoreBound(t *testing.T, dsn string) {
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--store-max-active", "2",
		"--store-active-recount", "250ms", "--tenant-from", "header:X-Api-Key", "--wait", "0s"}, io.Discard)
	if err != nil || cfg.StoreMaxActive != 2 || cfg.StoreActiveRecount != 250*time.Millisecond {
		t.Fatalf("parsed %d every %v, %v", cfg.StoreMaxActive, cfg.StoreActiveRecount, err)
	}
	release := make(chan struct{})
	held := make(chan struct{}, 2)
	api := &chargeAPI{}
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/slow" {
			held <- struct{}{}
			<-release
		}
		api.ServeHTTP(w, r)
	}))
	cfg.Store, cfg.Upstream = dsn, up.URL
	cfg.TenantSecret = []byte("tenant-secret-0123456789")
	_, base := startProxy(t, cfg)
	c := client(t)
	// A failure must not leave the held requests (and the proxy's
	// shutdown) waiting.
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock()
	done := make(chan reply, 2)
	for i := range 2 {
		key := string(rune('a' + i))
		go func() { done <- send(t, c, "POST", base+"/v1/slow", key, `{}`, "X-Api-Key", "sprayed-"+key) }()
		<-held
	}
	over := send(t, c, "POST", base+"/v1/charges", "c", `{}`, "X-Api-Key", "sprayed-c")
	if over.status != http.StatusServiceUnavailable || !strings.Contains(string(over.body), idem.SlugOverCapacity) || over.header.Get("Retry-After") == "" {
		t.Fatalf("at the bound: %d %s", over.status, over.body)
	}
	if dup := send(t, c, "POST", base+"/v1/slow", "a", `{}`, "X-Api-Key", "sprayed-a"); dup.status != http.StatusConflict {
		t.Fatalf("a duplicate of a held key at the bound: %d %s", dup.status, dup.body)
	}
	unblock()
	for range 2 {
		if r := <-done; r.status != http.StatusCreated {
			t.Fatalf("held request: %d", r.status)
		}
	}
	if n := api.calls.Load(); n != 2 {
		t.Fatalf("upstream called %d times, want 2", n)
	}
}
