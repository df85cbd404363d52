package cli

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgcluster"
)

// A proxy started while its database is down serves anyway: protected
// requests get 503 with Retry-After, readiness says not ready; once the
// database comes up the proxy opens and migrates the store and serves.
func TestProxyStartsWhileTheStoreIsDown(t *testing.T) {
	t.Parallel()
	// A private server, created but not started: its port is chosen now,
	// for the proxy's URL.
	pg := pgcluster.InitOnFreePort(t, "")
	api := &chargeAPI{}
	var log safeBuffer
	p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: pg.DSN() + "&connect_timeout=2", Admin: "127.0.0.1:0",
		TenantFrom: []string{"trusted-header:X-Tenant"}, Logger: log.logger()})
	c := client(t)
	ready := "http://" + p.AdminAddr().String() + "/readyz"

	for range 2 {
		r := send(t, c, "POST", base+"/v1/charges", "k", `{}`, "X-Tenant", "acme")
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" ||
			problemType(t, r) != idem.ProblemBase+"store-unavailable" {
			t.Fatalf("store down: %d %v %s, want 503 store-unavailable with Retry-After", r.status, r.header, r.body)
		}
		if r := send(t, c, "GET", ready, "", ""); r.status != http.StatusServiceUnavailable ||
			strings.Contains(string(r.body), strconv.Itoa(pg.Port)) || strings.Contains(string(r.body), "postgres") {
			t.Fatalf("readyz with the store down: %d %s, want 503 naming neither the port nor the user", r.status, r.body)
		}
	}
	// Unprotected requests do not need the store.
	if r := send(t, c, "GET", base+"/v1/charges", "", ""); r.status != http.StatusCreated {
		t.Errorf("GET with the store down: %d", r.status)
	}
	if api.calls.Load() != 1 {
		t.Fatalf("upstream calls %d, want 1 (the GET)", api.calls.Load())
	}

	if err := pg.Start(); err != nil {
		t.Fatalf("starting the private PostgreSQL: %v\n%s", err, pg.Log())
	}
	var r reply
	waitFor(t, "the proxy to serve once the database is up", func() bool {
		r = send(t, c, "POST", base+"/v1/charges", "k", `{}`, "X-Tenant", "acme")
		if r.status != http.StatusServiceUnavailable && r.status != http.StatusCreated {
			t.Fatalf("while the store comes up: %d %s", r.status, r.body)
		}
		return r.status == http.StatusCreated
	})
	if r := send(t, c, "POST", base+"/v1/charges", "k", `{}`, "X-Tenant", "acme"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %v, want a replay", r.status, r.header)
	}
	if r := send(t, c, "GET", ready, "", ""); r.status != http.StatusOK {
		t.Errorf("readyz with the store up: %d %s", r.status, r.body)
	}
	logs := log.String()
	for _, msg := range []string{"the store is unavailable", "the store is available"} {
		if n := strings.Count(logs, msg); n != 1 {
			t.Errorf("%q logged %d times, want once", msg, n)
		}
	}
}

// idem check waits out the 503s with Retry-After of an API whose store is
// briefly away, as a client would, and gives its verdicts once the store
// is back: here the proxy starts with its database down, and the database
// comes up while the checks run.
func TestCheckWaitsOutAStoreBrieflyAway(t *testing.T) {
	t.Parallel()
	pg := pgcluster.InitOnFreePort(t, "")
	_, base := startProxy(t, ProxyConfig{Upstream: slowCharges(t).URL, Store: pg.DSN() + "&connect_timeout=2",
		TenantFrom: []string{"authorization"}, TenantSecret: []byte("tenant-secret-0123456789")})
	if r := send(t, client(t), "POST", base+"/v1/charges", "k", `{}`, "Authorization", "Bearer main"); r.status != http.StatusServiceUnavailable ||
		r.header.Get("Retry-After") == "" {
		t.Fatalf("store down: %d %v, want 503 with Retry-After", r.status, r.header)
	}
	go func() {
		time.Sleep(time.Second)
		if err := pg.Start(); err != nil {
			t.Errorf("starting the private PostgreSQL: %v\n%s", err, pg.Log())
		}
	}()
	out, _, err := run("check", base+"/v1/charges", "--other-auth", "Bearer other", "--header", "Authorization: Bearer main",
		"--timeout", "30s")
	t.Log("\n" + out)
	if err != nil || !strings.Contains(out, "11 checks: 11 passed") {
		t.Fatalf("check across the store's return: %v, want 11 checks passed", err)
	}
}
