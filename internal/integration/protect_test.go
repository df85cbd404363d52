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
				e, err := idem.New(s, idem.Config{TenantMaxActive: 2, Logger: slog.New(slog.DiscardHandler),
					Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }})
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
					if w := send(hs[i], "acme", fmt.Sprint("held-", i)); w.Code != 201 {
						t.Errorf("held request %d: %d", i, w.Code)
					}
				}()
			}
			for inside.Load() < 2 {
				time.Sleep(time.Millisecond) // until both requests hold their keys
			}
			for i, h := range hs {
				w := send(h, "acme", fmt.Sprint("new-", i))
				if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), idem.SlugOverCap) || w.Header().Get("Retry-After") == "" {
					t.Fatalf("instance %d at the cap: %d %s", i, w.Code, w.Body)
				}
				scope := (&idem.Request{Tenant: "acme", Method: "POST", Route: "/v1/charges"}).Scope()
				if _, err := s.Get(context.Background(), scope, fmt.Sprint("new-", i)); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("a refused request left a record: %v", err)
				}
			}
			if w := send(hs[1], "acme", "held-0"); w.Code != http.StatusConflict {
				t.Fatalf("an in-flight duplicate at the cap: %d, want 409", w.Code)
			}
			if w := send(hs[0], "globex", "new-0"); w.Code != 201 || w.Header().Get(idem.ExpiresHeader) == "" {
				t.Fatalf("another tenant: %d, expiry %q", w.Code, w.Header().Get(idem.ExpiresHeader))
			}
			close(release)
			wg.Wait()
			if w := send(hs[1], "acme", "new-0"); w.Code != 201 {
				t.Fatalf("after the completions: %d", w.Code)
			}
			if got := runs.Load(); got != 4 {
				t.Fatalf("the handler ran %d times, want 4", got)
			}
		})
	}
}
