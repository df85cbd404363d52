package cache_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/postgres"
)

// A bound on active records over the cache is refused when the engine is
// made, exactly as over its backing store: a PostgreSQL store without
// TenantCap cannot count, and the cache in front of it must not hide that
// (every new key would then be refused 503 at run time instead).
func TestBoundsFollowTheBackingStore(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	rdb, prefix := redisClient(t)
	for _, tenantCap := range []bool{false, true} {
		pg, err := postgres.Open(context.Background(), url, postgres.Config{Schema: pgdb.Schema(t, url), MaxConns: 2, TenantCap: tenantCap})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pg.Close() })
		c := cache.New(pg, rdb, cache.Config{Prefix: prefix})
		for name, cfg := range map[string]idem.Config{
			"StoreMaxActive":  {StoreMaxActive: 10},
			"TenantMaxActive": {TenantMaxActive: 10, Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }},
		} {
			_, err := idem.New(c, cfg)
			switch {
			case !tenantCap && (err == nil || !strings.Contains(err.Error(), "TenantCap")):
				t.Errorf("%s over the cache over PostgreSQL without TenantCap: %v, want a refusal naming TenantCap", name, err)
			case tenantCap && err != nil:
				t.Errorf("%s over the cache over PostgreSQL with TenantCap: %v", name, err)
			}
		}
	}
}

// A bound on the records active across the store needs a backing store
// that counts them (store.ActiveCounter): over one that does not, the cache
// must not pass for one that does, or New would accept the bound and every
// new key would fail at run time.
func TestStoreMaxActiveNeedsABackingStoreThatCounts(t *testing.T) {
	t.Parallel()
	rdb, prefix := redisClient(t)
	notCounting := struct{ store.Store }{memory.New(memory.Config{})}
	c := cache.New(notCounting, rdb, cache.Config{Prefix: prefix, Logger: quiet})
	if _, err := idem.New(c, idem.Config{StoreMaxActive: 10, Logger: quiet}); err == nil || !strings.Contains(err.Error(), "StoreMaxActive") {
		t.Fatalf("StoreMaxActive over the cache over a store that cannot count: %v, want a refusal", err)
	}
	e, err := idem.New(c, idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.With(func(c *idem.Config) { c.StoreMaxActive = 10 }); err == nil {
		t.Fatal("With: StoreMaxActive over the cache over a store that cannot count was accepted")
	}

	c = cache.New(memory.New(memory.Config{}), rdb, cache.Config{Prefix: prefix, Logger: quiet})
	e, err = idem.New(c, idem.Config{StoreMaxActive: 1, Logger: quiet})
	if err != nil {
		t.Fatalf("StoreMaxActive over the cache over a store that counts: %v", err)
	}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		t.Fatalf("a request under the bound over the cache: %d %s, want 201", w.Code, w.Body)
	}
}
