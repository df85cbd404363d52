package cli

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// controlBytes are bytes a terminal acts on: ESC starts a sequence that
// can clear the screen, move the cursor, set the window title or write the
// clipboard (OSC 52); BEL ends an OSC; U+009B is the 8-bit CSI; a lone CR
// overwrites the line.
var controlBytes = []string{"\x1b", "\x07", "\u009b", "\rX"}

func checkNoControls(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, c := range controlBytes {
		if strings.Contains(out, c) {
			t.Errorf("%s prints %q raw:\n%q", what, c, out)
		}
	}
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("%s lacks %q:\n%q", what, w, out)
		}
	}
}

// What a stored record holds comes from clients and upstreams (bodies,
// headers, routes, tenants, error texts): inspect and keys list print it
// on the operator's terminal with its control characters escaped, never
// raw; line breaks of a body stay.
func TestOperatorOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	ctx := context.Background()

	fence := reserve(t, s, "answer", time.Minute, store.LeaseUnknown)
	fp := store.FenceParams{Scope: testScope, Key: "answer", Fence: fence}
	if err := s.Checkpoint(ctx, store.CheckpointParams{FenceParams: fp, RecoveryPoint: "charged\x1b[1A"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fp, TTL: time.Hour, Response: store.Response{Status: 200,
		Header: http.Header{"Content-Type": {"text/plain"}, "X-Note": {"a\x1b]0;owned\x07b"}},
		Body:   []byte("line 1\r\nline 2\n\x1b[2J\x1b]0;owned\x07\u009b31m\rXend\n")}}); err != nil {
		t.Fatal(err)
	}
	fence = reserve(t, s, "request", time.Minute, store.LeaseUnknown)
	if err := s.MarkUnknown(ctx, store.ReleaseParams{
		FenceParams: store.FenceParams{Scope: testScope, Key: "request", Fence: fence}, Error: "upstream said \x1b[31mno",
		Request: &store.PendingRequest{Method: "POST", Target: "/v1/charges", Fence: fence,
			Body: []byte(`{"note":"` + "\x1b]52;c;cm0gLXJmIH4=\x07" + `"}`)},
	}); err != nil {
		t.Fatal(err)
	}

	inspect := inspector(t, dsn)
	checkNoControls(t, "inspect of a stored answer", inspect("answer"),
		`X-Note: a\x1b]0;owned\ab`, "recovery point:", `charged\x1b[1A`, "line 1\r\nline 2\n", `\x1b[2J\x1b]0;owned\a\u009b31m\rXend`)
	checkNoControls(t, "inspect of a kept request", inspect("request"),
		`upstream said \x1b[31mno`, `{"note":"\x1b]52;c;cm0gLXJmIH4=\a"}`)

	tenant, route := "t\x1b[5m", "/v1/\x1b[2Jcharges"
	scope := (&idem.Request{Tenant: tenant, Method: "POST", Route: route}).Scope()
	if _, err := s.Reserve(ctx, store.ReserveParams{Scope: scope, Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour,
		LeasePolicy: store.LeaseUnknown}); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := run("keys", "list", "--store", dsn)
	if err != nil {
		t.Fatalf("keys list: %v\n%s", err, errOut)
	}
	checkNoControls(t, "keys list", out, `POST /v1/\x1b[2Jcharges`, `t\x1b[5m`)
}
