package cli

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// Readiness tells the truth about the store's operations, not only its
// connection: with the records table gone (a connection check still
// passes) /readyz is 503, its body names neither the store's host, port,
// user, database nor schema while the log has the detail, and once the
// table is back (and the circuit breaker's interval passed) it is ready
// again by itself.
func TestReadyzFailsWhileStoreOperationsFail(t *testing.T) {
	t.Parallel()
	u, schema := pgStore(t)
	var log safeBuffer
	p, base := startProxy(t, ProxyConfig{
		Upstream: newUpstream(t, &chargeAPI{}).URL,
		Store:    u.String(),
		Admin:    "127.0.0.1:0",
		Logger:   log.logger(),
		Config:   idem.Config{BreakerOpen: 500 * time.Millisecond, BreakerMaxOpen: time.Second},
	})
	c := client(t)
	ready := "http://" + p.AdminAddr().String() + "/readyz"
	if r := send(t, c, "GET", ready, "", ""); r.status != http.StatusOK {
		t.Fatalf("readyz: %d %s", r.status, r.body)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rename := func(from, to string) {
		t.Helper()
		if _, err := conn.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, from}.Sanitize()+" RENAME TO "+pgx.Identifier{to}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	rename("idem_records", "idem_records_away")
	if err := p.Store().Ping(ctx); err != nil {
		t.Fatalf("Ping with the table gone: %v (the test needs a store that still pings)", err)
	}
	r := send(t, c, "GET", ready, "", "")
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("readyz with every statement failing: %d %s, want 503", r.status, r.body)
	}
	body := string(r.body)
	for _, secret := range []string{u.Hostname(), u.Port(), u.User.Username(), strings.TrimPrefix(u.Path, "/"), schema, "idem_records"} {
		if secret != "" && strings.Contains(body, secret) {
			t.Errorf("the readyz body %q names %q", body, secret)
		}
	}
	if !strings.Contains(log.String(), "idem_records") {
		t.Errorf("the log does not have the store's error:\n%s", log.String())
	}
	// Requests fail and open the breaker; readiness says so.
	for i := range 6 {
		send(t, c, "POST", base+"/v1/charges", "k"+string(rune('a'+i)), `{}`)
	}
	if r := send(t, c, "GET", ready, "", ""); r.status != http.StatusServiceUnavailable ||
		!strings.Contains(string(r.body), "circuit breaker") {
		t.Errorf("readyz with the breaker open: %d %s", r.status, r.body)
	}

	rename("idem_records_away", "idem_records")
	waitFor(t, "readiness once the table is back", func() bool {
		return send(t, c, "GET", ready, "", "").status == http.StatusOK
	})
	if r := send(t, c, "POST", base+"/v1/charges", "back", `{}`); r.status != http.StatusCreated {
		t.Errorf("POST once ready: %d %s", r.status, r.body)
	}
	if n := strings.Count(log.String(), "not ready"); n < 1 || n > 3 {
		t.Errorf("%q logged %d times, want once per change of reason", "not ready", n)
	}
}
