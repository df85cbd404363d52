package cli

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/idem-go/idem"
)

func TestProxyKeyHeaderAndEcho(t *testing.T) {
	t.Parallel()
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--key-header", "x-request-key", "--echo-key"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KeyHeader != "x-request-key" || !cfg.EchoKey {
		t.Fatalf("parsed KeyHeader %q EchoKey %v", cfg.KeyHeader, cfg.EchoKey)
	}
	api := &chargeAPI{}
	up := newUpstream(t, api)
	cfg.Store, cfg.Upstream = "memory:", up.URL
	_, base := startProxy(t, cfg)
	c := client(t)

	first := send(t, c, "POST", base+"/v1/charges", "", `{"amount":100}`, "X-Request-Key", `"k1"`)
	second := send(t, c, "POST", base+"/v1/charges", "", `{"amount":100}`, "X-Request-Key", `"k1"`)
	reused := send(t, c, "POST", base+"/v1/charges", "", `{"amount":5}`, "X-Request-Key", `"k1"`)
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
	if first.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" ||
		reused.status != http.StatusUnprocessableEntity {
		t.Fatalf("answers %d, %d (replayed %q), %d", first.status, second.status,
			second.header.Get("Idempotent-Replayed"), reused.status)
	}
	for name, r := range map[string]reply{"executed": first, "replayed": second, "reused": reused} {
		if got := r.header.Values("X-Request-Key"); len(got) != 1 || got[0] != `"k1"` {
			t.Errorf("%s answer echoes %q, want [\"k1\"]", name, got)
		}
	}
	// The bare spelling is the same key: a replay, echoing the key as this
	// client spelled it, not as the first one did.
	bare := send(t, c, "POST", base+"/v1/charges", "", `{"amount":100}`, "X-Request-Key", `k1`)
	if got := bare.header.Values("X-Request-Key"); bare.header.Get("Idempotent-Replayed") != "true" || len(got) != 1 || got[0] != "k1" {
		t.Errorf("bare retry: replayed %q, echoes %q, want a replay echoing [k1]", bare.header.Get("Idempotent-Replayed"), got)
	}
	// Idempotency-Key is not the key here: the ietf profile asks for one.
	if r := send(t, c, "POST", base+"/v1/charges", "k2", `{}`); r.status != http.StatusBadRequest {
		t.Errorf("Idempotency-Key under --key-header x-request-key: %d, want 400", r.status)
	}

	if _, err := NewProxy(context.Background(), ProxyConfig{
		Upstream:     "http://x",
		Store:        "memory:",
		Listen:       "127.0.0.1:0",
		SingleTenant: true,
		Config:       idem.Config{KeyHeader: "bad header"},
	}); err == nil {
		t.Error("an invalid --key-header was accepted")
	}
}

// --echo-key follows the profile unless set: on under stripe (Stripe echoes
// the key, and its SDKs read it into the response they return), off under
// ietf.
func TestProxyEchoKeyFollowsProfile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--profile", "stripe"}, true},
		{[]string{"--profile", "stripe", "--echo-key=false"}, false},
		{[]string{"--echo-key=profile"}, false},
		{[]string{"--echo-key"}, true},
	} {
		cfg, _, _, err := parseProxyFlags(append([]string{"--upstream", "http://x"}, tc.args...), io.Discard)
		if err != nil || cfg.EchoKey != tc.want {
			t.Errorf("%q: EchoKey %v (%v), want %v", tc.args, cfg.EchoKey, err, tc.want)
		}
	}
}

// The settings the guard, the resolver and the webhook read before any
// engine exists take the engine's defaults, and the key header the
// canonical spelling the guard looks it up by.
func TestProxyTakesTheEnginesDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ set, want string }{{"", idem.DefaultKeyHeader}, {"x-request-key", "X-Request-Key"}} {
		cfg, err := ProxyConfig{Config: idem.Config{KeyHeader: tc.set}}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.KeyHeader != tc.want || cfg.MaxBodyBytes != idem.DefaultMaxBodyBytes ||
			cfg.MaxResponseBytes != idem.DefaultMaxResponseBytes || cfg.RetryAfter != idem.DefaultRetryAfter {
			t.Errorf("KeyHeader %q: got KeyHeader %q MaxBodyBytes %d MaxResponseBytes %d RetryAfter %v", tc.set,
				cfg.KeyHeader, cfg.MaxBodyBytes, cfg.MaxResponseBytes, cfg.RetryAfter)
		}
	}
}
