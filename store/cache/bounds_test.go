package cache_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store/cache"
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
