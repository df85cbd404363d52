package cli

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/wirecount"
	"github.com/idem-go/idem/store/memory"
)

// TestRewriteKeyedBodyInOneWrite: through the reverse proxy, the body the
// engine hands on reaches the upstream in the same write as the request's
// head; a request without a key keeps the reverse proxy's own body, whose
// head goes first.
func TestRewriteKeyedBodyInOneWrite(t *testing.T) {
	t.Parallel()
	const body = `{"amount":1299,"currency":"EUR"}`
	upstream := wirecount.NewUpstream(t)
	up, _ := url.Parse(upstream.URL)
	optional := false
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler), KeyRequired: &optional})
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{upstream: up, spansOff: true}
	front := httptest.NewServer(e.Middleware(&httputil.ReverseProxy{Rewrite: p.rewrite, Transport: upstream.Transport}))
	t.Cleanup(front.Close)
	c := client(t)
	for _, tc := range []struct {
		key    string
		writes int64
	}{
		{"one-write", 1},
		{"", 2},
	} {
		before := upstream.Writes()
		if r := send(t, c, http.MethodPost, front.URL+"/v1/charges", tc.key, body); r.status != http.StatusCreated {
			t.Fatalf("key %q: %d %s", tc.key, r.status, r.body)
		}
		if got := upstream.Body(); got != body {
			t.Errorf("key %q: the upstream got %q", tc.key, got)
		}
		if n := upstream.Writes() - before; n != tc.writes {
			t.Errorf("key %q: the request took %d writes to the upstream; want %d", tc.key, n, tc.writes)
		}
	}
}
