package cli

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// pgTopologies are the ways a proxy reaches PostgreSQL in production, each
// with the URL a user would write: directly in each of pgx's query modes,
// and through pgbouncer in transaction and session mode with the plain URL.
// The direct ones get a schema of their own through search_path; pgbouncer
// refuses that startup parameter, so those share the public schema of the
// pooler's own database (every key of these tests is new).
func pgTopologies(t *testing.T) map[string]func(t *testing.T) string {
	direct := func(mode string) func(t *testing.T) string {
		return func(t *testing.T) string {
			u := pgdb.URL(t, testenv.PostgresURL(t))
			if mode != "" {
				u = testenv.WithParam(t, u, "default_query_exec_mode", mode)
			}
			return u
		}
	}
	pooled := func(db string) func(t *testing.T) string {
		return func(t *testing.T) string { return testenv.PgbouncerURL(t, db) }
	}
	return map[string]func(t *testing.T) string{
		"direct":                 direct(""),
		"direct-cache_statement": direct("cache_statement"),
		"direct-cache_describe":  direct("cache_describe"),
		"direct-describe_exec":   direct("describe_exec"),
		"direct-exec":            direct("exec"),
		"direct-simple_protocol": direct("simple_protocol"),
		"pgbouncer-transaction":  pooled(testenv.PgbouncerTx),
		"pgbouncer-session":      pooled(testenv.PgbouncerSession),
		// One server connection: a restarted proxy meets the server
		// connection its predecessor used.
		"pgbouncer-transaction-one": pooled(testenv.PgbouncerTxOne),
	}
}

// TestProxyOnPostgresTopologies runs the same black-box conversation on
// every topology: the conformance checks of idem check (replay, 422, 409
// with Retry-After, concurrent duplicates, key spelling, tenants...), a
// restart of the proxy (the answer given before it replays after it, new
// keys run), and an upstream that is down and then back (the refused
// request is released, its retry runs once).
func TestProxyOnPostgresTopologies(t *testing.T) {
	t.Parallel()
	for name, topology := range pgTopologies(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsn := topology(t)
			api := &chargeAPI{}
			upstream := newUpstream(t, delayed(api, 100*time.Millisecond))
			cfg := ProxyConfig{Store: dsn, Upstream: upstream.URL, TenantFrom: []string{"authorization"},
				TenantSecret: []byte("topology tenant secret 0123456789"), StoreConns: 4}

			_, base, stop := startStoppable(t, cfg)
			out, _, err := run("check", base+"/v1/charges", "--other-auth", "Bearer other",
				"--header", "Authorization: Bearer main")
			if err != nil || !strings.Contains(out, "11 checks: 11 passed") {
				t.Fatalf("idem check: %v\n%s", err, out)
			}
			c := &http.Client{}
			key := testenv.Name("restart-")
			auth := []string{"Authorization", "Bearer main"}
			first := send(t, c, http.MethodPost, base+"/v1/charges", key, `{"amount":1}`, auth...)
			if first.status != http.StatusCreated {
				t.Fatalf("first answer %d %s", first.status, first.body)
			}
			stop()

			_, base, stop = startStoppable(t, cfg)
			again := send(t, c, http.MethodPost, base+"/v1/charges", key, `{"amount":1}`, auth...)
			if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) ||
				again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay after a restart: %d %s %v, want the first answer %s", again.status, again.body, again.header, first.body)
			}
			fresh := send(t, c, http.MethodPost, base+"/v1/charges", testenv.Name("fresh-"), `{"amount":2}`, auth...)
			if fresh.status != http.StatusCreated || bytes.Equal(fresh.body, first.body) {
				t.Fatalf("a new key after a restart: %d %s", fresh.status, fresh.body)
			}
			stop()

			// The upstream is down: the request is refused before it was
			// sent, so its key is released and the retry runs it, once.
			down := testenv.FreeAddr(t)
			cfg.Upstream = "http://" + down
			_, base, stop = startStoppable(t, cfg)
			key = testenv.Name("down-")
			if r := send(t, c, http.MethodPost, base+"/v1/charges", key, `{"amount":3}`, auth...); r.status < 500 {
				t.Fatalf("upstream down: %d %s, want a 5xx", r.status, r.body)
			}
			back := serveOn(t, down, api)
			defer back.Close()
			calls := api.calls.Load()
			if r := send(t, c, http.MethodPost, base+"/v1/charges", key, `{"amount":3}`, auth...); r.status != http.StatusCreated {
				t.Fatalf("retry once the upstream is back: %d %s", r.status, r.body)
			}
			if r := send(t, c, http.MethodPost, base+"/v1/charges", key, `{"amount":3}`, auth...); r.status != http.StatusCreated ||
				r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second retry: %d %v, want a replay", r.status, r.header)
			}
			if n := api.calls.Load() - calls; n != 1 {
				t.Fatalf("the upstream ran the retried key %d times, want 1", n)
			}
			stop()
		})
	}
}

// serveOn serves h on addr.
func serveOn(t *testing.T, addr string, h http.Handler) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", addr, err)
	}
	s := httptest.NewUnstartedServer(h)
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	return s
}
