package cli

import (
	"net/http"
	"testing"

	"github.com/idem-go/idem/internal/testkit/pgrelay"
)

// A reservation whose answer PostgreSQL lost as it went away, through the
// proxy: a relay passes the reservation's row on, then cuts the
// connection before the commit's answer and refuses new ones. The client
// gets 503 and idem_reservations_unacknowledged says 1; once the server
// is back, the client's retry gives the reservation back and runs the
// request, once, and the gauge falls to 0.
func TestProxyLostReservation(t *testing.T) {
	t.Parallel()
	u, _ := pgStore(t)
	relay := pgrelay.New(t, u.String())
	api := &chargeAPI{}
	c := client(t)
	// No background services: their statements would share the relay.
	p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: relay.URL, Admin: "127.0.0.1:0", NoMaintenance: true})
	metrics := func() string {
		return string(send(t, c, "GET", "http://"+p.AdminAddr().String()+"/metrics", "", "").body)
	}

	relay.SetDown(true)
	relay.Arm()
	if r := send(t, c, "POST", base+"/v1/charges", "lost", `{}`); r.status != http.StatusServiceUnavailable {
		t.Fatalf("the request whose reservation's answer was lost: %d %s, want 503", r.status, r.body)
	}
	if !relay.Cut() {
		t.Fatal("the relay never cut a connection")
	}
	if m := metrics(); !metricLine(m, "idem_reservations_unacknowledged", " 1") {
		t.Fatalf("idem_reservations_unacknowledged is not 1:\n%s", grepLines(m, "idem_reservations"))
	}
	relay.SetDown(false)
	if r := send(t, c, "POST", base+"/v1/charges", "lost", `{}`); r.status != http.StatusCreated {
		t.Fatalf("the retry once the server is back: %d %s, want 201", r.status, r.body)
	}
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
	if m := metrics(); !metricLine(m, "idem_reservations_unacknowledged", " 0") {
		t.Fatalf("idem_reservations_unacknowledged is not 0:\n%s", grepLines(m, "idem_reservations"))
	}
}
