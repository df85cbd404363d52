package idem_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

// expiryEnv runs one engine (and a derived one for /v1/long) over a
// memory store sharing a step clock; handlers can move the clock to model
// a long operation.
type expiryEnv struct {
	clk *stepClock
	st  *memory.Store
	mux *http.ServeMux
}

func newExpiryEnv(t *testing.T, ttl, longTTL time.Duration) *expiryEnv {
	t.Helper()
	clk := newStepClock()
	x := &expiryEnv{clk: clk, st: memory.New(memory.Config{Clock: clk.Now}), mux: http.NewServeMux()}
	e, err := idem.New(x.st, idem.Config{TTL: ttl, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	long, err := e.With(func(c *idem.Config) { c.TTL = longTTL })
	if err != nil {
		t.Fatal(err)
	}
	slow := func(w http.ResponseWriter, r *http.Request) {
		clk.Advance(time.Hour) // the operation runs an hour
		if r.URL.Query().Has("fail") {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		if r.URL.Query().Has("stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			w.Write([]byte("data: x\n\n"))
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
	x.mux.Handle("POST /v1/charges", e.Middleware(http.HandlerFunc(slow)))
	x.mux.Handle("POST /v1/long", long.Middleware(http.HandlerFunc(slow)))
	return x
}

func (x *expiryEnv) send(t *testing.T, target, key string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("POST", target, strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	x.mux.ServeHTTP(w, r)
	return w
}

func wantExpires(t *testing.T, what string, w *httptest.ResponseRecorder, want time.Time) {
	t.Helper()
	got := w.Header().Get(idem.ExpiresHeader)
	if got != want.UTC().Format(http.TimeFormat) {
		t.Fatalf("%s: %s %q, want %q", what, idem.ExpiresHeader, got, want.UTC().Format(http.TimeFormat))
	}
}

// The stored answer and every replay name the record's expiry, a TTL
// after the completion (not after the reservation), and a route's longer
// TTL applies to its records.
func TestExpiryHeader(t *testing.T) {
	t.Parallel()
	x := newExpiryEnv(t, 2*time.Hour, 48*time.Hour)
	start := x.clk.Now()
	done := start.Add(time.Hour)

	w := x.send(t, "/v1/charges", "a")
	if w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	wantExpires(t, "executed answer", w, done.Add(2*time.Hour))
	rec, err := x.st.Get(context.Background(), (&idem.Request{Method: "POST", Route: "/v1/charges"}).Scope(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.ExpiresAt.Equal(done.Add(2 * time.Hour)) {
		t.Fatalf("record ExpiresAt %v, want completion + TTL %v", rec.ExpiresAt, done.Add(2*time.Hour))
	}
	x.clk.Advance(90 * time.Minute) // past reservation + TTL, before completion + TTL
	w = x.send(t, "/v1/charges", "a")
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v", w.Code, w.Header())
	}
	wantExpires(t, "replay", w, done.Add(2*time.Hour))

	long := x.send(t, "/v1/long", "a")
	wantExpires(t, "executed answer of a route with a longer TTL", long, x.clk.Now().Add(48*time.Hour))
	x.clk.Advance(24 * time.Hour)
	if w := x.send(t, "/v1/long", "a"); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the longer TTL did not keep the answer for a day: %d", w.Code)
	}

	// Past the expiry the key is free: the request runs again.
	if w := x.send(t, "/v1/charges", "a"); w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("replayed past its expiry")
	}
}

// An answer that was not stored (released for another attempt) names no
// expiry; a streamed answer names the earliest its record can expire.
func TestExpiryHeaderReleasedAndStreamed(t *testing.T) {
	t.Parallel()
	x := newExpiryEnv(t, 2*time.Hour, 48*time.Hour)
	if w := x.send(t, "/v1/charges?fail", "f"); w.Code != 502 || w.Header().Get(idem.ExpiresHeader) != "" {
		t.Fatalf("released answer: %d with %s %q, want none", w.Code, idem.ExpiresHeader, w.Header().Get(idem.ExpiresHeader))
	}
	w := x.send(t, "/v1/charges?stream", "s")
	wantExpires(t, "streamed answer", w, x.clk.Now().Add(2*time.Hour))
	wantExpires(t, "replay of the streamed answer", x.send(t, "/v1/charges?stream", "s"), x.clk.Now().Add(2*time.Hour))
}

// A stored answer that carried an Idempotency-Key-Expires of its own (an
// upstream behind another idem) is replayed with this record's expiry.
func TestExpiryHeaderOverridesAStoredOne(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	st := memory.New(memory.Config{Clock: clk.Now})
	e, err := idem.New(st, idem.Config{TTL: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(idem.ExpiresHeader, "Thu, 01 Jan 1970 00:00:00 GMT")
		w.WriteHeader(201)
	}))
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/x", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	want := clk.Now().Add(time.Hour)
	wantExpires(t, "executed", send(), want)
	wantExpires(t, "replay", send(), want)
}
