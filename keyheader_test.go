package idem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

func TestKeyHeaderIsConfigurable(t *testing.T) {
	f := newFixture(t, idem.Config{KeyHeader: "x-request-key"}, nil)
	c := post("", `{"amount":100}`)
	c.header.Set("X-Request-Key", `"k1"`)
	if w := f.do(c); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := f.do(c)
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second: %d replayed=%q, want a replay", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	// The default name is now an ordinary header: under the ietf profile a
	// request carrying only it has no key.
	if w := f.do(post(`"k2"`, `{"amount":100}`)); w.Code != http.StatusBadRequest {
		t.Fatalf("Idempotency-Key under another KeyHeader: %d, want 400", w.Code)
	}
	if w.Header()["X-Request-Key"] != nil {
		t.Fatalf("key echoed without EchoKey: %q", w.Header()["X-Request-Key"])
	}
}

func TestKeyHeaderMustBeAToken(t *testing.T) {
	for _, name := range []string{"Idempotency Key", "Key:", "Schlüssel"} {
		_, err := idem.New(memory.New(memory.Config{}), idem.Config{KeyHeader: name})
		if err == nil || !strings.Contains(err.Error(), "KeyHeader") {
			t.Errorf("KeyHeader %q: err = %v, want a KeyHeader error", name, err)
		}
	}
}

func TestEchoKey(t *testing.T) {
	f := newFixture(t, idem.Config{EchoKey: true}, nil)
	const key = `"echo-1"`
	executed := f.do(post(key, `{"amount":100}`))
	replayed := f.do(post(key, `{"amount":100}`))
	reused := f.do(post(key, `{"amount":200}`))
	for name, w := range map[string]interface {
		Header() http.Header
	}{"executed": executed, "replayed": replayed, "reused": reused} {
		if got := w.Header()["Idempotency-Key"]; len(got) != 1 || got[0] != key {
			t.Errorf("%s answer: Idempotency-Key = %q, want [%s]", name, got, key)
		}
	}
	if executed.Code != http.StatusCreated || replayed.Header().Get("Idempotent-Replayed") != "true" ||
		reused.Code != http.StatusUnprocessableEntity {
		t.Fatalf("codes %d %d %d, want 201, a replay, 422", executed.Code, replayed.Code, reused.Code)
	}
	// A retry that spells the key bare is the same key, replayed, and is
	// told the key as it sent it, not as the first request did.
	bare := f.do(post(`echo-1`, `{"amount":100}`))
	if got := bare.Header()["Idempotency-Key"]; bare.Header().Get("Idempotent-Replayed") != "true" || len(got) != 1 || got[0] != "echo-1" {
		t.Errorf("bare retry: replayed %q, Idempotency-Key = %q, want a replay with [echo-1]",
			bare.Header().Get("Idempotent-Replayed"), got)
	}
	// Two keys are answered with a problem that still names both.
	two := post(`"a"`, `{}`)
	two.header.Add("Idempotency-Key", `"b"`)
	bad := f.do(two)
	if got := bad.Header()["Idempotency-Key"]; bad.Code != http.StatusBadRequest || len(got) != 2 {
		t.Fatalf("two keys: %d echo=%q", bad.Code, got)
	}
	// Requests without a key and unprotected methods get no header.
	get := f.do(call{method: "GET", path: "/v1/charges", header: http.Header{}})
	if get.Header()["Idempotency-Key"] != nil {
		t.Fatalf("GET answer carries %q", get.Header()["Idempotency-Key"])
	}
}
