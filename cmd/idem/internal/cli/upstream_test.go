package cli

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

// countWriter counts the writes it gets: net/http writes a request's head
// and body in one write, or flushes the head first.
type countWriter struct {
	writes int
	buf    bytes.Buffer
}

func (w *countWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.buf.Write(p)
}

// heldBody is a body held in memory, as the engine hands one on: a reader
// that knows its length, of a type net/http does not know.
type heldBody struct{ *bytes.Reader }

func TestInMemoryBodyOneWrite(t *testing.T) {
	t.Parallel()
	const body = `{"amount":1299,"currency":"EUR"}`
	for _, tc := range []struct {
		name   string
		in     io.Reader
		writes int
	}{
		{"held in memory", heldBody{bytes.NewReader([]byte(body))}, 1},
		{"a stream of unknown length", struct{ io.Reader }{strings.NewReader(body)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := http.NewRequest(http.MethodPost, "http://upstream/v1/charges", nil)
			if err != nil {
				t.Fatal(err)
			}
			// Wrapped as the reverse proxy wraps it.
			out.Body, out.ContentLength = io.NopCloser(struct{ io.Reader }{tc.in}), int64(len(body))
			inMemoryBody(out, tc.in)
			var w countWriter
			if err := out.Write(&w); err != nil {
				t.Fatal(err)
			}
			if w.writes != tc.writes || !strings.HasSuffix(w.buf.String(), "\r\n\r\n"+body) {
				t.Errorf("%d writes of %q; want %d, ending in the body", w.writes, w.buf.String(), tc.writes)
			}
		})
	}
}

// TestRewriteKeyedBodyInOneWrite: the body the engine hands the reverse
// proxy reaches the upstream in the same write as the request's head.
func TestRewriteKeyedBodyInOneWrite(t *testing.T) {
	t.Parallel()
	up, _ := url.Parse("http://upstream.test")
	p := &Proxy{upstream: up, spansOff: true}
	var w countWriter
	var writeErr error
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// What httputil.ReverseProxy does before Rewrite.
		out := r.Clone(r.Context())
		out.Body = io.NopCloser(struct{ io.Reader }{r.Body})
		pr := &httputil.ProxyRequest{In: r, Out: out}
		p.rewrite(pr)
		writeErr = pr.Out.Write(&w)
		rw.WriteHeader(http.StatusCreated)
	}))
	const body = `{"amount":1299,"currency":"EUR"}`
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "one-write")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated || writeErr != nil {
		t.Fatalf("%d %s, write: %v", rec.Code, rec.Body, writeErr)
	}
	if w.writes != 1 || !strings.HasSuffix(w.buf.String(), "\r\n\r\n"+body) {
		t.Errorf("%d writes of %q; want 1, ending in the body", w.writes, w.buf.String())
	}
}
