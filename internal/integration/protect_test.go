package integration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// On every real store, two engines sharing it (two instances) hold a
// tenant to its cap together: with the cap's worth of requests in flight,
// a new key gets 429 tenant-over-cap from either, nothing is reserved and
// nothing runs; another tenant is served; the place is free again once a
// request completes. Each answer names the key's expiry.
func TestTenantCapAcrossInstances(t *testing.T) {
	testBoundAcrossInstances(t, idem.Config{TenantMaxActive: 2}, func(string) string { return "acme" },
		http.StatusTooManyRequests, idem.SlugOverCap)
}

// The bound across the store needs no tenant: requests that each mint a
// fresh tenant (a new credential every time) are held to it by two
// instances together, 503 over-capacity, nothing reserved, duplicates of a
// held key still answered; the place is free again once a request
// completes. A recount on every call makes the bound exact here (see
// idem.Config.StoreMaxActive for its precision with the default recount).
func TestStoreBoundAcrossInstances(t *testing.T) {
	testBoundAcrossInstances(t, idem.Config{StoreMaxActive: 2, StoreActiveRecount: time.Nanosecond},
		func(key string) string { return "fresh-" + key }, http.StatusServiceUnavailable, idem.SlugOverCapacity)
}

func testBoundAcrossInstances(t *testing.T, cfg idem.Config, tenantOf func(key string) string, status int, slug string) {
	for _, ns := range engineStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			s := ns.Open(t, nil)
			release := make(chan struct{})
			var runs, inside atomic.Int64
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				if strings.HasPrefix(r.Header.Get("Idempotency-Key"), "held") {
					inside.Add(1)
					<-release
				}
				w.WriteHeader(http.StatusCreated)
			})
			var hs []http.Handler
			for range 2 {
				cfg := cfg
				cfg.Logger = slog.New(slog.DiscardHandler)
				cfg.Tenant = func(r *http.Request) string { return r.Header.Get("X-Tenant") }
				e, err := idem.New(s, cfg)
				if err != nil {
					t.Fatal(err)
				}
				hs = append(hs, e.Middleware(handler))
			}
			send := func(h http.Handler, tenant, key string) *httptest.ResponseRecorder {
				r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
				r.Header.Set("Idempotency-Key", key)
				r.Header.Set("X-Tenant", tenant)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprint("held-", i)
					if w := send(hs[i], tenantOf(key), key); w.Code != 201 {
						t.Errorf("held request %d: %d", i, w.Code)
					}
				}()
			}
			for inside.Load() < 2 {
				time.Sleep(time.Millisecond) // until both requests hold their keys
			}
			for i, h := range hs {
				key := fmt.Sprint("new-", i)
				w := send(h, tenantOf(key), key)
				if w.Code != status || !strings.Contains(w.Body.String(), slug) || w.Header().Get("Retry-After") == "" {
					t.Fatalf("instance %d at the bound: %d %s", i, w.Code, w.Body)
				}
				scope := (&idem.Request{Tenant: tenantOf(key), Method: "POST", Route: "/v1/charges"}).Scope()
				if _, err := s.Get(context.Background(), scope, key); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("a refused request left a record: %v", err)
				}
			}
			if w := send(hs[1], tenantOf("held-0"), "held-0"); w.Code != http.StatusConflict {
				t.Fatalf("an in-flight duplicate at the bound: %d, want 409", w.Code)
			}
			want := int64(2)
			if tenantOf("a") == tenantOf("b") {
				if w := send(hs[0], "globex", "new-0"); w.Code != 201 || w.Header().Get(idem.ExpiresHeader) == "" {
					t.Fatalf("another tenant: %d, expiry %q", w.Code, w.Header().Get(idem.ExpiresHeader))
				}
				want++
			}
			close(release)
			wg.Wait()
			if w := send(hs[1], tenantOf("new-0"), "new-0"); w.Code != 201 {
				t.Fatalf("after the completions: %d", w.Code)
			}
			if got := runs.Load(); got != want+1 {
				t.Fatalf("the handler ran %d times, want %d", got, want+1)
			}
		})
	}
}
