package client_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// api is a charge endpoint that counts its executions and records what
// every request that reached the server carried.
type api struct {
	executions atomic.Int32
	// during, when set, runs inside the handler before it answers, with
	// the number of the execution.
	during func(n int32)

	mu       sync.Mutex
	requests []request // every request that reached the server
	bodies   []string  // the body of every execution
}

type request struct{ key, body string }

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := a.executions.Add(1)
	a.mu.Lock()
	a.bodies = append(a.bodies, string(body))
	a.mu.Unlock()
	if a.during != nil {
		a.during(n)
	}
	switch string(body) {
	case bodyUnavailable:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "provider down", http.StatusServiceUnavailable)
		return
	case bodyBad:
		http.Error(w, "bad amount", http.StatusBadRequest)
		return
	case bodyUncertain:
		// What a payment gateway's timeout leaves: the charge may or may
		// not exist, so the key's outcome is unknown until reconciled.
		idem.FromContext(r.Context()).Uncertain("gateway timed out")
		http.Error(w, "gateway timed out", http.StatusGatewayTimeout)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
}

// Bodies that make the handler answer otherwise than 201.
const (
	bodyBad       = `{"amount":"bad"}`
	bodyUncertain = `{"gateway":"times out"}`
	// bodyUnavailable gets a 503 with Retry-After from the handler.
	bodyUnavailable = `{"provider":"down"}`
)

// seen records the key of every request in front of everything else, also
// of those a fault stops before the middleware.
func (a *api) seen(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		a.mu.Lock()
		a.requests = append(a.requests, request{r.Header.Get("Idempotency-Key"), string(body)})
		a.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

func (a *api) received() []request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]request(nil), a.requests...)
}

// server runs the real idem middleware over a at POST /v1/charges; front,
// when set, wraps the middleware (a fault in front of it). It returns the
// server and the memory store behind the engine.
func server(t *testing.T, a *api, cfg idem.Config, front func(http.Handler) http.Handler) (*httptest.Server, *memory.Store) {
	t.Helper()
	st := memory.New(memory.Config{})
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	engine, err := idem.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = engine.Middleware(a)
	if front != nil {
		h = front(h)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", a.seen(h))
	mux.Handle("GET /v1/charges", a.seen(a))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, st
}

// failFirst answers the first n requests with status and the headers in
// hdr (name, value pairs) before they reach next.
func failFirst(n int32, status int, hdr ...string) func(http.Handler) http.Handler {
	var seen atomic.Int32
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if seen.Add(1) > n {
				next.ServeHTTP(w, r)
				return
			}
			for i := 0; i+1 < len(hdr); i += 2 {
				w.Header().Set(hdr[i], hdr[i+1])
			}
			w.WriteHeader(status)
			fmt.Fprintf(w, "failure %d\n", seen.Load())
		})
	}
}

// jsonField returns the string member name of the JSON object b.
func jsonField(t *testing.T, b []byte, name string) string {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	s, _ := doc[name].(string)
	return s
}
