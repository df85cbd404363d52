package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
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

// clock is the time of a test: Now stands still unless a wait moves it,
// Sleep records the waits and returns at once (or runs onSleep), and
// Jitter keeps the computed wait, so the delays are exact.
type clock struct {
	mu      sync.Mutex
	now     time.Time
	delays  []time.Duration
	onSleep func(ctx context.Context, d time.Duration) error
}

func newClock() *clock {
	return &clock{now: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.delays = append(c.delays, d)
	c.now = c.now.Add(d)
	hook := c.onSleep
	c.mu.Unlock()
	if hook != nil {
		return hook(ctx, d)
	}
	return ctx.Err()
}

func (c *clock) Delays() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.delays...)
}

// tracked counts the responses its transport hands out and those whose
// body was closed: every response the retrying transport discards must be
// closed, and only the one it returns may stay open.
type tracked struct {
	base   http.RoundTripper
	issued atomic.Int32
	closed atomic.Int32
}

func (tr *tracked) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := tr.base.RoundTrip(r)
	if resp != nil {
		tr.issued.Add(1)
		resp.Body = &closeCounter{ReadCloser: resp.Body, n: &tr.closed}
	}
	return resp, err
}

type closeCounter struct {
	io.ReadCloser
	n    *atomic.Int32
	once sync.Once
}

func (c *closeCounter) Close() error {
	c.once.Do(func() { c.n.Add(1) })
	return c.ReadCloser.Close()
}

// newTransport returns a Transport over a fresh connection per attempt, so
// that a cut connection is seen by the retrying transport and not hidden by
// net/http's own re-send on a reused connection, with c's time.
func newTransport(t *testing.T, c *clock) (*client.Transport, *tracked) {
	base := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(base.CloseIdleConnections)
	tr := &tracked{base: base}
	return &client.Transport{Base: tr, Now: c.Now, Sleep: c.Sleep, Jitter: func(d time.Duration) time.Duration { return d }}, tr
}

func post(t *testing.T, ctx context.Context, tr http.RoundTripper, url, body string, hdr ...string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	return resp, b, nil
}

// relay is a TCP hop between the client and a server, where the tests cut
// connections as a network would: the server keeps running, and only what
// travels back to the client is lost.
type relay struct {
	ln     net.Listener
	target string
	// drop: the next drop connections lose their response: when the
	// server starts answering, both sides are closed and nothing of the
	// answer reaches the client.
	drop atomic.Int32
	// dropped receives a value each time a response was dropped, or was
	// lost because the client side had been cut.
	dropped chan struct{}

	mu      sync.Mutex
	clients map[net.Conn]*hop
	wg      sync.WaitGroup
}

type hop struct {
	client, server net.Conn
	cut            atomic.Bool
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, dropped: make(chan struct{}, 16), clients: map[net.Conn]*hop{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *relay) URL() string { return "http://" + r.ln.Addr().String() }

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		h := &hop{client: c, server: s}
		r.mu.Lock()
		r.clients[c] = h
		r.mu.Unlock()
		drop := false
		if r.drop.Load() > 0 {
			drop = r.drop.Add(-1) >= 0
		}
		r.wg.Add(2)
		go r.upstream(h)
		go r.downstream(h, drop)
	}
}

// upstream forwards the client's bytes. When the client side was cut on
// purpose the server side stays open, as a server does not notice a cable
// pulled on the far side of a network until it writes.
func (r *relay) upstream(h *hop) {
	defer r.wg.Done()
	io.Copy(h.server, h.client)
	if !h.cut.Load() {
		h.server.Close()
	}
}

func (r *relay) downstream(h *hop, drop bool) {
	defer r.wg.Done()
	defer r.forget(h)
	if drop {
		var b [1]byte
		h.server.Read(b[:]) // the server has started answering: it ran
		h.cut.Store(true)
		h.client.Close()
		h.server.Close()
		r.dropped <- struct{}{}
		return
	}
	io.Copy(h.client, h.server)
	if h.cut.Load() {
		// The answer, or its first bytes, met a closed client side.
		r.dropped <- struct{}{}
	}
	h.client.Close()
	h.server.Close()
}

func (r *relay) forget(h *hop) {
	r.mu.Lock()
	delete(r.clients, h.client)
	r.mu.Unlock()
}

// cutClients closes the client side of every open connection, as a
// network failure would, while the server side stays open.
func (r *relay) cutClients() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, h := range r.clients {
		h.cut.Store(true)
		c.Close()
	}
}

func (r *relay) close() {
	r.ln.Close()
	r.mu.Lock()
	for c, h := range r.clients {
		c.Close()
		h.server.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
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
