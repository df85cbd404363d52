package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/wirecount"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

// fixture is an engine over a memory store with a manual clock, in front of
// a handler that counts its calls.
type fixture struct {
	t      *testing.T
	clock  *storetest.Clock
	store  *enginetest.Flaky
	engine *idem.Engine
	calls  atomic.Int64
	h      http.Handler
}

func newFixture(t *testing.T, cfg idem.Config, handler http.HandlerFunc) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: storetest.NewClock()}
	f.store = &enginetest.Flaky{Store: memory.New(memory.Config{Clock: f.clock.Now})}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := idem.New(f.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.engine = e
	if handler == nil {
		handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Set-Cookie", "session=secret")
			w.Header().Set("Location", "/v1/charges/ch_1")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"ch_1","amount":100}`)
		}
	}
	mux := http.NewServeMux()
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		handler(w, r)
	})
	mux.Handle("/v1/charges", e.Middleware(counted))
	mux.Handle("/v1/refunds", e.Middleware(counted))
	f.h = mux
	return f
}

type call struct {
	method, path, body string
	header             http.Header
}

func post(key, body string) call {
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return call{method: "POST", path: "/v1/charges", body: body, header: h}
}

func (f *fixture) do(c call) *httptest.ResponseRecorder {
	f.t.Helper()
	r := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
	for k, v := range c.header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

const uuid = `"8e03978e-40d5-43e8-bc93-6894a57f9324"`

func TestReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	first := f.do(post(uuid, `{"amount":100,"currency":"eur"}`))
	if first.Code != 201 || first.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v", first.Code, first.Header())
	}
	// Same request, other spelling of the JSON and of the key.
	second := f.do(post(strings.Trim(uuid, `"`), `{ "currency": "eur", "amount": 100 }`))
	if second.Code != 201 || !bytes.Equal(second.Body.Bytes(), first.Body.Bytes()) {
		t.Fatalf("replay: %d %q, want 201 %q", second.Code, second.Body, first.Body)
	}
	if second.Header().Get("Idempotent-Replayed") != "true" || second.Header().Get("Location") != "/v1/charges/ch_1" ||
		second.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("replay headers: %v", second.Header())
	}
	if second.Header().Get("Set-Cookie") != "" {
		t.Fatal("replay carried Set-Cookie")
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestHopByHopHeadersNotReplayed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Private")
		w.Header().Set("X-Private", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Public", "2")
		w.WriteHeader(200)
	})
	f.do(post(uuid, `{}`))
	w := f.do(post(uuid, `{}`))
	for _, h := range []string{"Connection", "X-Private", "Keep-Alive"} {
		if w.Header().Get(h) != "" {
			t.Fatalf("replay carried %s", h)
		}
	}
	if w.Header().Get("X-Public") != "2" {
		t.Fatalf("replay lost X-Public: %v", w.Header())
	}
}

// A field written under another spelling of its name (net/http sends map
// keys as written; clients read names without regard to case) is filtered
// as its canonical name would be: a retry never gets the first caller's
// cookie, nor a hop-by-hop field.
func TestNonCanonicalFieldNamesNotReplayed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["set-cookie"] = []string{"session=alice"}
		h["SET-COOKIE2"] = []string{"a=b"}
		h["connection"] = []string{"x-private"}
		h["X-Private"] = []string{"1"}
		h["keep-alive"] = []string{"timeout=5"}
		h["date"] = []string{"Mon, 02 Jan 2006 15:04:05 GMT"}
		h["x-public"] = []string{"2"}
		w.WriteHeader(200)
	})
	if w := f.do(post(uuid, `{}`)); w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %v", w.Header())
	}
	w := f.do(post(uuid, `{}`))
	if w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not a replay: %d %v", w.Code, w.Header())
	}
	for k := range w.Header() {
		for _, bad := range []string{"Set-Cookie", "Set-Cookie2", "Connection", "X-Private", "Keep-Alive", "Date"} {
			if strings.EqualFold(k, bad) {
				t.Errorf("replay carried %s: %v", k, w.Header()[k])
			}
		}
	}
	//lint:ignore SA1008 the handler wrote the field under this spelling, which the replay keeps
	if got := w.Header()["x-public"]; len(got) != 1 || got[0] != "2" {
		t.Fatalf("replay lost x-public (kept as spelled): %v", w.Header())
	}
}

// A handler under a key cannot hijack its connection: what it would send
// on it could be neither recorded nor replayed. It gets idem.ErrHijack, by
// either way of asking, and can still answer; a request without a key
// passes through and may hijack.
func TestHijackRefusedUnderAKey(t *testing.T) {
	t.Parallel()
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler), KeyRequired: idem.Bool(false)})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv := httptest.NewServer(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		conn, _, err1 := http.NewResponseController(w).Hijack()
		if r.Header.Get("Idempotency-Key") == "" {
			// No key: the connection is the handler's.
			if err1 != nil {
				t.Errorf("hijack without a key: %v", err1)
				return
			}
			conn.Close()
			return
		}
		if err1 == nil {
			conn.Close()
			t.Errorf("hijacked under a key")
			return
		}
		hj, ok := w.(http.Hijacker)
		if !ok {
			t.Errorf("the writer is no http.Hijacker")
			return
		}
		_, _, err2 := hj.Hijack()
		if !errors.Is(err1, idem.ErrHijack) || !errors.Is(err2, idem.ErrHijack) {
			t.Errorf("hijack under a key: %v, %v; want idem.ErrHijack", err1, err2)
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "answered")
	})))
	defer srv.Close()
	send := func(key string) (*http.Response, string, error) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/upgrade", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		c := srv.Client()
		c.Timeout = 10 * time.Second
		resp, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	for i, replayed := range []string{"", "true"} {
		resp, body, err := send(`"h1"`)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 201 || body != "answered" || resp.Header.Get("Idempotent-Replayed") != replayed {
			t.Fatalf("request %d: %d %q %v", i, resp.StatusCode, body, resp.Header)
		}
	}
	if _, _, err := send(""); err == nil {
		t.Fatal("without a key the handler hijacked and closed the connection, yet a response arrived")
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (once under the key, once without)", n)
	}
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	enginetest.WantProblem(t, f.do(post("", `{}`)), 400, "key-missing")
	if f.calls.Load() != 0 {
		t.Fatal("handler ran without a key")
	}
	// The Stripe profile lets it through; so does an explicit option.
	s := newFixture(t, idem.Config{Profile: idem.ProfileStripe}, nil)
	if w := s.do(post("", `{}`)); w.Code != 201 || s.calls.Load() != 1 {
		t.Fatalf("stripe profile without a key: %d, calls %d", w.Code, s.calls.Load())
	}
	o := newFixture(t, idem.Config{KeyRequired: idem.Bool(false)}, nil)
	if w := o.do(post("", `{}`)); w.Code != 201 {
		t.Fatalf("optional key: %d", w.Code)
	}
}

func TestMalformedKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	for name, key := range map[string]string{
		"empty quoted": `""`,
		"too long":     `"` + strings.Repeat("a", 256) + `"`,
		"control char": "\"abc\x01def\"",
		"unterminated": `"abc`,
		"inner space":  `abc def`,
		"non-ascii":    `"clé"`,
	} {
		t.Run(name, func(t *testing.T) {
			enginetest.WantProblem(t, f.do(post(key, `{}`)), 400, "key-malformed")
		})
	}
	if w := f.do(post(`"`+strings.Repeat("a", 255)+`"`, `{}`)); w.Code != 201 {
		t.Fatalf("255-character key: %d", w.Code)
	}
	c := post(uuid, `{}`)
	c.header["Idempotency-Key"] = []string{uuid, uuid}
	enginetest.WantProblem(t, f.do(c), 400, "key-repeated")
	// A list in one field line is a repetition too.
	enginetest.WantProblem(t, f.do(post(`"a", "b"`, `{}`)), 400, "key-repeated")
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1 (the valid 255-character key)", n)
	}
}

func TestKeyReused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	f.do(post(uuid, `{"amount":100}`))
	enginetest.WantProblem(t, f.do(post(uuid, `{"amount":200}`)), 422, "key-reused")
	// The original record is untouched: it still replays.
	if w := f.do(post(uuid, `{"amount":100}`)); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("original after a mismatch: %d", w.Code)
	}
	// Another route is another scope: the same key is a new request there.
	c := post(uuid, `{"amount":200}`)
	c.path = "/v1/refunds"
	if w := f.do(c); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("same key on another route: %d %v", w.Code, w.Header())
	}
	if n := f.calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestStripeProfileErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Profile: idem.ProfileStripe}, nil)
	f.do(post(uuid, `{"amount":100}`))
	w := f.do(post(uuid, `{"amount":200}`))
	if w.Code != 400 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("stripe mismatch: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	var doc struct {
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || doc.Error.Type != "idempotency_error" ||
		!strings.Contains(doc.Error.Message, "same parameters") {
		t.Fatalf("stripe error body %s (%v)", w.Body, err)
	}
}

// Under the stripe profile a duplicate in flight gets the one refusal every
// official Stripe SDK retries (429 lock_timeout, Stripe-Should-Retry: true,
// Retry-After); 409 is Stripe's own idempotency_key_in_use; 202 is refused;
// final refusals say Stripe-Should-Retry: false; a replay names the
// original request.
func TestStripeProfileInFlightAndRetryHeaders(t *testing.T) {
	t.Parallel()
	stripeDoc := func(t *testing.T, w *httptest.ResponseRecorder) (typ, code string) {
		t.Helper()
		var doc struct{ Error struct{ Type, Code string } }
		if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
			t.Fatalf("stripe error body %q: %v", w.Body, err)
		}
		return doc.Error.Type, doc.Error.Code
	}
	for _, tc := range []struct {
		status int
		code   string
	}{{0, "lock_timeout"}, {409, "idempotency_key_in_use"}} {
		h, started, release := blocking()
		f := newFixture(t, idem.Config{Profile: idem.ProfileStripe, InProgressStatus: tc.status}, h)
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- f.do(post(uuid, `{"a":1}`)) }()
		<-started
		w := f.do(post(uuid, `{"a":1}`))
		want := tc.status
		if want == 0 {
			want = 429
		}
		if typ, code := stripeDoc(t, w); w.Code != want || typ != "idempotency_error" || code != tc.code ||
			w.Header().Get("Stripe-Should-Retry") != "true" || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("stripe in flight (status %d): %d %s %s %v", tc.status, w.Code, typ, code, w.Header())
		}
		close(release)
		<-done
	}

	h := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Request-Id", "req_first")
		w.WriteHeader(200)
		io.WriteString(w, `{"id":"cus_1"}`)
	}
	f := newFixture(t, idem.Config{Profile: idem.ProfileStripe}, h)
	if w := f.do(post(uuid, `{"a":1}`)); w.Header().Get("Original-Request") != "" {
		t.Fatalf("first answer names an original request: %v", w.Header())
	}
	w := f.do(post(uuid, `{"a":1}`))
	if w.Header().Get("Idempotent-Replayed") != "true" || w.Header().Get("Original-Request") != "req_first" ||
		w.Header().Get("Request-Id") != "req_first" {
		t.Fatalf("stripe replay headers: %v", w.Header())
	}
	w = f.do(post(uuid, `{"a":2}`))
	if _, code := stripeDoc(t, w); w.Code != 400 || code != "key-reused" || w.Header().Get("Stripe-Should-Retry") != "false" {
		t.Fatalf("stripe key reused: %d %s %v", w.Code, code, w.Header())
	}
	// The IETF profile sends neither header.
	i := newFixture(t, idem.Config{}, h)
	i.do(post(uuid, `{"a":1}`))
	if w := i.do(post(uuid, `{"a":1}`)); w.Header().Get("Original-Request") != "" {
		t.Fatalf("ietf replay names an original request: %v", w.Header())
	}
	if w := i.do(post(uuid, `{"a":2}`)); w.Header().Get("Stripe-Should-Retry") != "" {
		t.Fatalf("ietf problem carries Stripe-Should-Retry: %v", w.Header())
	}

	for _, bad := range []idem.Config{
		{Profile: idem.ProfileStripe, InProgressStatus: 202},
		{Profile: idem.ProfileStripe, InProgressStatus: 503},
		{InProgressStatus: 429},
	} {
		if _, err := idem.New(memory.New(memory.Config{}), bad); err == nil {
			t.Fatalf("%s profile with in-progress status %d accepted", bad.Profile, bad.InProgressStatus)
		}
	}
}

// blocking returns a handler that signals when it starts and waits for
// release before answering 201.
func blocking() (http.HandlerFunc, chan struct{}, chan struct{}) {
	started, release := make(chan struct{}, 16), make(chan struct{})
	return func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		w.WriteHeader(201)
		io.WriteString(w, `{"ok":true}`)
	}, started, release
}

func TestInFlightDuplicate(t *testing.T) {
	t.Parallel()
	h, started, release := blocking()
	f := newFixture(t, idem.Config{RetryAfter: 2 * time.Second}, h)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- f.do(post(uuid, `{"a":1}`)) }()
	<-started
	w := f.do(post(uuid, `{"a":1}`))
	enginetest.WantProblem(t, w, 409, "request-in-progress")
	if w.Header().Get("Retry-After") != "2" {
		t.Fatalf("Retry-After %q, want 2", w.Header().Get("Retry-After"))
	}
	// A different body is refused as a mismatch even while in flight.
	enginetest.WantProblem(t, f.do(post(uuid, `{"a":2}`)), 422, "key-reused")
	close(release)
	if first := <-done; first.Code != 201 {
		t.Fatalf("original: %d", first.Code)
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestWaitThenReplay(t *testing.T) {
	t.Parallel()
	h, started, release := blocking()
	f := newFixture(t, idem.Config{Wait: 10 * time.Second}, h)
	done := make(chan *httptest.ResponseRecorder, 2)
	go func() { done <- f.do(post(uuid, `{"a":1}`)) }()
	<-started
	go func() { done <- f.do(post(uuid, `{"a":1}`)) }()
	time.Sleep(20 * time.Millisecond) // let the duplicate start waiting
	close(release)
	a, b := <-done, <-done
	if a.Code != 201 || b.Code != 201 || a.Body.String() != b.Body.String() {
		t.Fatalf("wait mode: %d %q / %d %q", a.Code, a.Body, b.Code, b.Body)
	}
	if a.Header().Get("Idempotent-Replayed")+b.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("exactly one of the two answers should be a replay")
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestUncertainOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		idem.FromContext(r.Context()).Uncertain("payment gateway timed out")
		w.WriteHeader(http.StatusGatewayTimeout)
	})
	if w := f.do(post(uuid, `{}`)); w.Code != 504 {
		t.Fatalf("first: %d", w.Code)
	}
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 409, "outcome-unknown")
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("an unknown outcome was executed again (%d calls)", n)
	}
}

func TestStoreDownAtReserveFailsClosed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	f.store.Down.Store(true)
	w := f.do(post(uuid, `{}`))
	enginetest.WantProblem(t, w, 503, "store-unavailable")
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if f.calls.Load() != 0 {
		t.Fatal("handler ran while the store was down")
	}
	f.store.Down.Store(false)
	if w := f.do(post(uuid, `{}`)); w.Code != 201 || f.calls.Load() != 1 {
		t.Fatalf("after the outage: %d, calls %d", w.Code, f.calls.Load())
	}
}

func TestStoreTimeoutAtReserveFailsClosed(t *testing.T) {
	t.Parallel()
	slow := &slowStore{Store: memory.New(memory.Config{}), delay: time.Second}
	e, err := idem.New(slow, idem.Config{StoreTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	r := httptest.NewRequest("POST", "/x", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", uuid)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	enginetest.WantProblem(t, w, 503, "store-unavailable")
	if calls.Load() != 0 {
		t.Fatal("handler ran after a store timeout")
	}
}

type slowStore struct {
	store.Store
	delay time.Duration
}

func (s *slowStore) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return store.ReserveResult{}, ctx.Err()
	}
	return s.Store.Reserve(ctx, p)
}

func TestStoreDownAtComplete(t *testing.T) {
	t.Parallel()
	// A short lease: the engine retries the completion until the lease it
	// holds would lapse, then gives up.
	f := newFixture(t, idem.Config{Lease: 200 * time.Millisecond}, nil)
	f.store.FailCompletes.Store(1 << 30)
	// The client still gets the response it earned.
	w := f.do(post(uuid, `{}`))
	if w.Code != 201 || !strings.Contains(w.Body.String(), "ch_1") {
		t.Fatalf("response when Complete failed: %d %q", w.Code, w.Body)
	}
	// No expiry is promised for an answer that was not stored: no retry
	// will replay it.
	if got := w.Header().Get(idem.ExpiresHeader); got != "" {
		t.Errorf("%s: %s on an answer whose completion was not stored", idem.ExpiresHeader, got)
	}
	if n := f.store.Completes.Load(); n < 2 {
		t.Fatalf("Complete tried %d times, want retries", n)
	}
	f.store.FailCompletes.Store(0)
	// The record was not released: a retry cannot execute a second time.
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 409, "request-in-progress")
	f.clock.Advance(time.Second) // the lease expires in store time: policy unknown
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 409, "outcome-unknown")
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestPanicMarksUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		panic("boom")
	})
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("panic not propagated: %v", p)
			}
		}()
		f.do(post(uuid, `{}`))
	}()
	enginetest.WantProblem(t, f.do(post(uuid, `{}`)), 409, "outcome-unknown")
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestResponsePolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		stored bool
		cfg    idem.Config
	}{
		{200, true, idem.Config{}},
		{302, true, idem.Config{}},
		{400, true, idem.Config{}},
		{404, true, idem.Config{}},
		{408, false, idem.Config{}},
		{425, false, idem.Config{}},
		{429, false, idem.Config{}},
		{500, false, idem.Config{}},
		{503, false, idem.Config{}},
		{500, true, idem.Config{StoreServerErrors: true}},
		{429, true, idem.Config{StoreServerErrors: true}},
	} {
		f := newFixture(t, tc.cfg, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(tc.status) })
		f.do(post(uuid, `{}`))
		w := f.do(post(uuid, `{}`))
		replayed := w.Header().Get("Idempotent-Replayed") == "true"
		if w.Code != tc.status || replayed != tc.stored {
			t.Fatalf("status %d (%+v): second answer %d replayed=%v, want stored=%v", tc.status, tc.cfg, w.Code, replayed, tc.stored)
		}
		want := int64(2)
		if tc.stored {
			want = 1
		}
		if n := f.calls.Load(); n != want {
			t.Fatalf("status %d: handler ran %d times, want %d", tc.status, n, want)
		}
	}
}

func TestBodyLimits(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{MaxBodyBytes: 64}, nil)
	big := `{"a":"` + strings.Repeat("x", 100) + `"}`
	enginetest.WantProblem(t, f.do(post(uuid, big)), 413, "body-too-large")
	// Unknown length (chunked): the limit holds while reading.
	r := httptest.NewRequest("POST", "/v1/charges", io.MultiReader(strings.NewReader(big)))
	r.ContentLength = -1
	r.Header.Set("Idempotency-Key", uuid)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	enginetest.WantProblem(t, w, 413, "body-too-large")
	// A body longer than the length it declares (a request built by a
	// framework or a test, not read off the wire by net/http) is refused:
	// what the handler would read is not what was declared.
	r = httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"a":1}`))
	r.ContentLength = 3
	r.Header.Set("Idempotency-Key", uuid)
	w = httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	enginetest.WantProblem(t, w, 400, "body-unreadable")
	exact := `{"a":"` + strings.Repeat("x", 64-8) + `"}`
	if w := f.do(post(uuid, exact)); w.Code != 201 {
		t.Fatalf("body of exactly the limit: %d", w.Code)
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestInvalidBodies(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	for _, body := range []string{`{"a":`, `{"a":1,"a":2}`, "{\"a\":\"\xff\"}", `{"a":01}`} {
		p := enginetest.WantProblem(t, f.do(post(uuid, body)), 400, "invalid-body")
		if p.Detail == "" {
			t.Fatalf("invalid body %q: no detail", body)
		}
	}
	if f.calls.Load() != 0 {
		t.Fatal("handler ran on an invalid body")
	}
	// The handler sees the body exactly as sent.
	var seen []byte
	g := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		seen, _ = io.ReadAll(r.Body)
	})
	g.do(post(uuid, `{ "b": 2, "a": 1 }`))
	if string(seen) != `{ "b": 2, "a": 1 }` {
		t.Fatalf("handler saw %q", seen)
	}
}

func TestLargeResponseKeptWithoutBody(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 2000)
	f := newFixture(t, idem.Config{MaxResponseBytes: 1000}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(201)
		io.WriteString(w, big[:1000])
		io.WriteString(w, big[1000:])
	})
	if w := f.do(post(uuid, `{}`)); w.Code != 201 || w.Body.String() != big {
		t.Fatalf("first answer truncated: %d, %d bytes", w.Code, w.Body.Len())
	}
	w := f.do(post(uuid, `{}`))
	if w.Code != 201 || w.Body.Len() != 0 || w.Header().Get("Idempotent-Body-Omitted") != "true" ||
		w.Header().Get("Idempotent-Replayed") != "true" || w.Header().Get("Content-Type") != "text/plain" {
		t.Fatalf("replay of an over-limit response: %d %q %v", w.Code, w.Body, w.Header())
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("over-limit response re-executed: %d calls", n)
	}
}

// An answer of exactly MaxResponseBytes is within the limit: stored whole
// and replayed whole, through the middleware and through Run.
func TestResponseAtTheLimitKeptWhole(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("y", 1000)
	f := newFixture(t, idem.Config{MaxResponseBytes: len(body)}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, body[:500])
		io.WriteString(w, body[500:])
	})
	f.do(post(uuid, `{}`))
	if w := f.do(post(uuid, `{}`)); w.Code != 201 || w.Body.String() != body || w.Header().Get("Idempotent-Body-Omitted") != "" {
		t.Fatalf("replay of an answer at the limit: %d, %d bytes, %v", w.Code, w.Body.Len(), w.Header())
	}

	e, err := idem.New(memory.New(memory.Config{}), idem.Config{MaxResponseBytes: len(body), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c := idem.Call{Method: "POST", Route: "/v1/run", Target: "/v1/run", Keys: []string{"k"}}
	run := func(context.Context) idem.Result {
		return idem.Result{Response: store.Response{Status: 201, Body: []byte(body)}}
	}
	e.Run(context.Background(), c, run)
	if a := e.Run(context.Background(), c, run); a.Verdict != idem.Replayed || string(a.Response.Body) != body || a.Response.BodyOmitted {
		t.Fatalf("Run's replay of an answer at the limit: %v, %d bytes, omitted %v", a.Verdict, len(a.Response.Body), a.Response.BodyOmitted)
	}
}

func TestUnprotectedMethodsPassThrough(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		if idem.FromContext(r.Context()) != nil {
			t.Error("unprotected method got an execution")
		}
		w.WriteHeader(200)
	})
	for _, m := range []string{"GET", "HEAD", "OPTIONS", "PUT", "DELETE"} {
		for i := 0; i < 2; i++ {
			c := post(uuid, "")
			c.method = m
			if w := f.do(c); w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s: %d %v", m, w.Code, w.Header())
			}
		}
		c := post("", "")
		c.method = m
		if w := f.do(c); w.Code != 200 {
			t.Fatalf("%s without a key: %d", m, w.Code)
		}
	}
	if n := f.calls.Load(); n != 15 {
		t.Fatalf("handler ran %d times, want 15", n)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}, nil)
	a, b := post(uuid, `{"x":1}`), post(uuid, `{"x":2}`)
	a.header.Set("X-Tenant", "acme")
	b.header.Set("X-Tenant", "globex")
	if w := f.do(a); w.Code != 201 {
		t.Fatal(w.Code)
	}
	if w := f.do(b); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("second tenant got %d %v", w.Code, w.Header())
	}
	if n := f.calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestFenceAndTakeover(t *testing.T) {
	t.Parallel()
	var fences []int64
	var mu sync.Mutex
	h, started, release := blocking()
	f := newFixture(t, idem.Config{LeasePolicy: store.LeaseRetry}, func(w http.ResponseWriter, r *http.Request) {
		x := idem.FromContext(r.Context())
		mu.Lock()
		fences = append(fences, x.Fence())
		mu.Unlock()
		h(w, r)
	})
	done := make(chan *httptest.ResponseRecorder, 2)
	go func() { done <- f.do(post(uuid, `{}`)) }()
	<-started
	// The first holder is cut off: its lease expires in store time.
	f.clock.Advance(31 * time.Second)
	go func() { done <- f.do(post(uuid, `{}`)) }()
	<-started
	close(release)
	<-done
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(fences) != 2 || fences[0] <= 0 || fences[1] <= fences[0] {
		t.Fatalf("fences %v, want two growing fences", fences)
	}
	rec, err := f.store.Get(context.Background(), "0:POST /v1/charges", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	if err != nil || rec.Fence != fences[1] || rec.State != store.StateCompleted {
		t.Fatalf("record after takeover: %+v %v", rec, err)
	}
}

// A completion whose first attempt failed in a way that may have applied
// it, and whose retry finds the record taken over and completed by another
// execution with the very same answer, is not taken for its own: the
// record holds the other execution's fence. The first caller gets the
// answer its handler produced, without an expiry (its completion is not
// the one stored), and the engine says it no longer held the record.
func TestCompletionTakenOverIsNotTakenForOwn(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	relA, relB := make(chan struct{}), make(chan struct{})
	startedA, startedB := make(chan struct{}), make(chan struct{})
	var n atomic.Int64
	f := newFixture(t, idem.Config{LeasePolicy: store.LeaseRetry, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				close(startedA)
				<-relA
			} else {
				close(startedB)
				<-relB
			}
			w.WriteHeader(201)
			io.WriteString(w, `{"ok":true}`)
		})
	a := make(chan *httptest.ResponseRecorder, 1)
	go func() { a <- f.do(post(uuid, `{}`)) }()
	<-startedA
	f.clock.Advance(31 * time.Second) // the first holder's lease lapses in store time
	b := make(chan *httptest.ResponseRecorder, 1)
	go func() { b <- f.do(post(uuid, `{}`)) }()
	<-startedB
	close(relB)
	if w := <-b; w.Code != 201 || w.Header().Get(idem.ExpiresHeader) == "" {
		t.Fatalf("the execution that took over: %d %v", w.Code, w.Header())
	}
	f.store.FailCompletes.Store(1)
	close(relA)
	w := <-a
	if w.Code != 201 || w.Body.String() != `{"ok":true}` || w.Header().Get(idem.ExpiresHeader) != "" {
		t.Fatalf("the first holder: %d %q %v, want its answer without an expiry", w.Code, w.Body, w.Header())
	}
	if l := logs.String(); !strings.Contains(l, "no longer holds the record") || strings.Contains(l, "outcome recorded") {
		t.Fatalf("logs: %s", l)
	}
}

func TestClientDisconnectMidRequest(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, err := idem.New(s, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	returned := make(chan struct{})
	srv := httptest.NewServer(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		close(entered)
		<-r.Context().Done() // the handler gives up when its client leaves
	})))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/x", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", uuid)
	errc := make(chan error)
	go func() {
		_, err := http.DefaultClient.Do(req)
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request succeeded")
	}
	<-returned
	// The engine records the outcome after the handler returns.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err := s.Get(context.Background(), "0:POST /x", strings.Trim(uuid, `"`))
		if err == nil && rec.State == store.StateUnknown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record after the client left: %+v %v, want unknown", rec, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStreamingFlushPassesThrough(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, _ := idem.New(s, idem.Config{})
	proceed := make(chan struct{})
	srv := httptest.NewServer(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		<-proceed
		io.WriteString(w, "second\n")
	})))
	defer srv.Close()
	send := func() *http.Response {
		req, _ := http.NewRequest("POST", srv.URL+"/stream", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", uuid)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := send()
	line := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, line); err != nil || string(line) != "first\n" {
		t.Fatalf("flushed chunk: %q %v", line, err)
	}
	close(proceed)
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(rest) != "second\n" {
		t.Fatalf("rest %q", rest)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r2 := send()
		b, _ := io.ReadAll(r2.Body)
		r2.Body.Close()
		if r2.StatusCode == 200 {
			if string(b) != "first\nsecond\n" || r2.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay of a streamed response: %q %v", b, r2.Header)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replay: %d %s", r2.StatusCode, b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNestedMiddlewareReservesOnce(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, _ := idem.New(s, idem.Config{})
	var calls atomic.Int64
	h := e.Middleware(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(201)
	})))
	for i := 0; i < 2; i++ {
		r := httptest.NewRequest("POST", "/x", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", uuid)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 201 {
			t.Fatal(w.Code)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times", calls.Load())
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	for _, cfg := range []idem.Config{
		{Profile: "soap"},
		{LeasePolicy: "maybe"},
		{KeyReusedStatus: 200},
		{TTL: -time.Second},
		{MaxBodyBytes: -1},
		{InProgressStatus: 200},
		{RetryAfter: -time.Second},
		{StoreTimeout: -time.Second},
		{MaxResponseBytes: -1},
		{Fields: []string{"amount", "a~2b"}},
	} {
		if _, err := idem.New(s, cfg); err == nil {
			t.Fatalf("New(%+v) accepted an invalid config", cfg)
		}
	}
	if _, err := idem.New(nil, idem.Config{}); err == nil {
		t.Fatal("New without a store")
	}
}

func TestEmptyJSONBodyIsEmpty(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, nil)
	if w := f.do(post(uuid, "")); w.Code != 201 {
		t.Fatalf("body-less POST labelled JSON: %d %s", w.Code, w.Body)
	}
	if w := f.do(post(uuid, "")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v", w.Code, w.Header())
	}
}

func TestSelectedFields(t *testing.T) {
	t.Parallel()
	// Only amount and currency identify the request; the order of the list
	// does not matter.
	f := newFixture(t, idem.Config{Fields: []string{"currency", "amount"}}, nil)
	g := newFixture(t, idem.Config{Fields: []string{"amount", "currency"}}, nil)
	f.do(post(uuid, `{"amount":100,"currency":"eur","trace":"a"}`))
	if w := f.do(post(uuid, `{"amount":100,"currency":"eur","trace":"b"}`)); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("unselected field changed: %d", w.Code)
	}
	enginetest.WantProblem(t, f.do(post(uuid, `{"amount":200,"currency":"eur","trace":"a"}`)), 422, "key-reused")
	fa, _ := f.engine.Fingerprint(idem.Call{Method: "POST", Route: "/x", Target: "/x", ContentType: "application/json", Body: []byte(`{"amount":1,"currency":"eur"}`)})
	ga, _ := g.engine.Fingerprint(idem.Call{Method: "POST", Route: "/x", Target: "/x", ContentType: "application/json", Body: []byte(`{"amount":1,"currency":"eur"}`)})
	if fa != ga {
		t.Fatal("the order of Fields changed the fingerprint")
	}
}

func TestSelectedFieldsOnAMislabelledBody(t *testing.T) {
	t.Parallel()
	// A JSON document sent as a form (curl -d without a Content-Type) has
	// none of the selected fields: two different ones must not share a
	// fingerprint.
	f := newFixture(t, idem.Config{Fields: []string{"amount", "currency"}}, nil)
	form := func(body string) call {
		c := post(uuid, body)
		c.header.Set("Content-Type", "application/x-www-form-urlencoded")
		return c
	}
	if w := f.do(form(`{"amount":1000}`)); w.Code != 201 {
		t.Fatal(w.Code)
	}
	enginetest.WantProblem(t, f.do(form(`{"amount":2000}`)), 422, "key-reused")
}

func TestScopeFromMethodPattern(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, _ := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}", e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
	})))
	r := httptest.NewRequest("POST", "/v1/orders/42", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k1")
	mux.ServeHTTP(httptest.NewRecorder(), r)
	// The pattern, not the path, scopes the key; its method is not repeated.
	if _, err := s.Get(context.Background(), "0:POST /v1/orders/{id}", "k1"); err != nil {
		t.Fatalf("record under the pattern's scope: %v", err)
	}
}

func TestClientGoneMidResponseIsNotReplayedTruncated(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, _ := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler), MaxResponseBytes: 64 << 20})
	firstChunk := make(chan struct{})
	done := make(chan struct{})
	srv := httptest.NewServer(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		w.Write(chunk)
		http.NewResponseController(w).Flush()
		close(firstChunk)
		// Stream until the write fails because the client went away, as
		// io.Copy would.
		for i := 0; i < 1000; i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})))
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/export", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "export-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-firstChunk
	resp.Body.Close() // the client leaves mid-body
	<-done
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err := s.Get(context.Background(), "0:POST /export", "export-1")
		if err == nil && rec.State == store.StateUnknown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record after the client left mid-body: %+v %v, want unknown", rec.State, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The concrete target is part of the request: the same key and body on
// another resource, or with another query, is a reused key, never a replay
// of the other request's answer. The scope keeps the route pattern.
func TestTargetIsPartOfTheRequest(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, _ := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}/pay", e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(201)
		io.WriteString(w, "paid "+r.PathValue("id")+" "+r.URL.Query().Get("amount"))
	})))
	send := func(target, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", target, strings.NewReader(`{"note":"x"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	if w := send("/v1/orders/1/pay", "k1"); w.Code != 201 || w.Body.String() != "paid 1 " {
		t.Fatalf("order 1: %d %q", w.Code, w.Body)
	}
	enginetest.WantProblem(t, send("/v1/orders/2/pay", "k1"), 422, "key-reused")
	if w := send("/v1/orders/1/pay", "k1"); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "paid 1 " {
		t.Fatalf("retry of order 1: %d %q", w.Code, w.Body)
	}

	if w := send("/v1/orders/3/pay?amount=5&currency=eur", "k2"); w.Code != 201 || w.Body.String() != "paid 3 5" {
		t.Fatalf("amount 5: %d %q", w.Code, w.Body)
	}
	enginetest.WantProblem(t, send("/v1/orders/3/pay?amount=500&currency=eur", "k2"), 422, "key-reused")
	// The same pairs in another order and spelling are the same request.
	if w := send("/v1/orders/3/pay?currency=%65ur&amount=5", "k2"); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "paid 3 5" {
		t.Fatalf("retry with the query reordered: %d %q", w.Code, w.Body)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	if _, err := s.Get(context.Background(), "0:POST /v1/orders/{id}/pay", "k1"); err != nil {
		t.Fatalf("record under the pattern's scope: %v", err)
	}
}

// Methods are matched without regard to case: post and Post go through
// the protocol as POST, and the upper-case match allocates nothing.
func TestMethodsMatchAnyCase(t *testing.T) {
	s := memory.New(memory.Config{})
	e, _ := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler), Methods: []string{"post", "PATCH"}})
	var calls atomic.Int64
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(201)
	}))
	for i, m := range []string{"post", "Post", "POST"} {
		r := httptest.NewRequest(m, "/x", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if replayed := w.Header().Get("Idempotent-Replayed") == "true"; w.Code != 201 || replayed != (i > 0) {
			t.Fatalf("%s: %d replayed=%v", m, w.Code, replayed)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
	if m, ok := e.Protected("patch"); !ok || m != "PATCH" {
		t.Fatalf("patch: %q %v", m, ok)
	}
	if _, ok := e.Protected("GET"); ok {
		t.Fatal("GET protected")
	}
	if n := testing.AllocsPerRun(100, func() { e.Protected("POST") }); n != 0 {
		t.Fatalf("matching POST allocates %v times", n)
	}
}

// Replays filter the stored headers again, whoever stored them.
func TestReplayFiltersStoredHeaders(t *testing.T) {
	t.Parallel()
	// A record written without the engine's filter (an operator's tool).
	// With a Connection field the replay filters a copy; without one it
	// filters as it writes: both drop the same fields.
	for _, tc := range []struct {
		name   string
		header http.Header
		want   []string // dropped
	}{
		{"with a Connection field", http.Header{
			"Set-Cookie": {"session=other-callers"}, "Connection": {"X-Hop"}, "X-Hop": {"1"},
			"X-Bad": {"a\nb"}, "X-Good": {"yes"},
			// Other spellings, as a tool that kept the handler's map might.
			"set-cookie": {"session=lowercase"}, "connection": {"x-hop2"}, "X-Hop2": {"2"}, "transfer-encoding": {"chunked"},
		}, []string{"Set-Cookie", "Connection", "X-Hop", "X-Bad", "set-cookie", "connection", "X-Hop2", "transfer-encoding"}},
		{"without one", http.Header{
			"X-Bad": {"a\r\nInjected: 1"}, "X-Nul": {"a\x00b"}, "X-Del": {"\x7f"}, "Bad Name": {"1"},
			"Set-Cookie": {"session=other-callers"}, "Keep-Alive": {"timeout=5"}, "X-Good": {"yes"}, "X-Tab": {"a\tb"},
		}, []string{"X-Bad", "X-Nul", "X-Del", "Bad Name", "Set-Cookie", "Keep-Alive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := memory.New(memory.Config{})
			e, _ := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
			body := []byte(`{"a":1}`)
			fp, err := e.Fingerprint(idem.Call{Method: "POST", Route: "/v1/charges", Target: "/v1/charges", ContentType: "application/json", Body: body})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			res, err := s.Reserve(ctx, store.ReserveParams{Scope: "0:POST /v1/charges", Key: "k", Fingerprint: fp,
				Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
			if err != nil {
				t.Fatal(err)
			}
			err = s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "0:POST /v1/charges", Key: "k", Fence: res.Record.Fence},
				TTL: time.Hour, Response: store.Response{Status: 201, Body: []byte("ok"), Header: tc.header}})
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("POST", "/v1/charges", bytes.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", "k")
			w := httptest.NewRecorder()
			e.Middleware(http.NotFoundHandler()).ServeHTTP(w, r)
			if w.Code != 201 || w.Header().Get("X-Good") != "yes" || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %v", w.Code, w.Header())
			}
			for _, h := range tc.want {
				if _, ok := w.Header()[h]; ok {
					t.Fatalf("replay carried %s", h)
				}
			}
			if v, ok := tc.header["X-Tab"]; ok && !slices.Equal(w.Header()["X-Tab"], v) {
				t.Fatalf("replay lost X-Tab (a tab is allowed in a value): %v", w.Header())
			}
		})
	}
}

// The in-flight answer is 409 by default, 202 by option, both with
// Retry-After; any other status is a configuration error.
func TestInProgressStatus(t *testing.T) {
	t.Parallel()
	h, started, release := blocking()
	f := newFixture(t, idem.Config{InProgressStatus: http.StatusAccepted}, h)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- f.do(post(uuid, `{"a":1}`)) }()
	<-started
	w := f.do(post(uuid, `{"a":1}`))
	enginetest.WantProblem(t, w, 202, "request-in-progress")
	if w.Header().Get("Retry-After") != "1" {
		t.Fatalf("202 without Retry-After: %v", w.Header())
	}
	close(release)
	<-done
	if _, err := idem.New(memory.New(memory.Config{}), idem.Config{InProgressStatus: 429}); err == nil {
		t.Fatal("InProgressStatus 429 accepted")
	}
}

// Handle takes the route from its caller and reports whether next ran, so
// a framework can stop its chain when the engine answered itself.
func TestHandleReportsWhetherNextRan(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	e, _ := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })
	send := func(method, key string) (*httptest.ResponseRecorder, bool) {
		r := httptest.NewRequest(method, "/v1/things/7", strings.NewReader(`{}`))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		ran := e.Handle(w, r, "/v1/things/:id", next)
		return w, ran
	}
	for _, c := range []struct {
		method, key string
		code        int
		ran         bool
	}{
		{"POST", "k", 201, true},  // executed
		{"POST", "k", 201, false}, // replayed
		{"POST", "", 400, false},  // refused
		{"GET", "", 201, true},    // not protected
	} {
		if w, ran := send(c.method, c.key); w.Code != c.code || ran != c.ran {
			t.Fatalf("%s key %q: %d ran=%v, want %d ran=%v", c.method, c.key, w.Code, ran, c.code, c.ran)
		}
	}
	if _, err := s.Get(context.Background(), "0:POST /v1/things/:id", "k"); err != nil {
		t.Fatalf("record under the given route: %v", err)
	}
}

// WriteProblem renders an integration's own refusal in the engine's
// profile.
func TestWriteProblem(t *testing.T) {
	t.Parallel()
	p := idem.Problem{Slug: "tenant-missing", Status: 401, Title: "No tenant", Detail: "send X-Tenant-ID", RetryAfter: 1500 * time.Millisecond}
	ietf, _ := idem.New(memory.New(memory.Config{}), idem.Config{})
	w := httptest.NewRecorder()
	ietf.WriteProblem(w, p)
	doc := enginetest.WantProblem(t, w, 401, "tenant-missing")
	if doc.Detail != "send X-Tenant-ID" || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("ietf problem: %+v %v", doc, w.Header())
	}
	stripe, _ := idem.New(memory.New(memory.Config{}), idem.Config{Profile: idem.ProfileStripe})
	w = httptest.NewRecorder()
	p.RetryAfter = 0
	stripe.WriteProblem(w, p)
	var body struct {
		Error struct{ Type, Code, Message string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != 401 || body.Error.Code != "tenant-missing" ||
		body.Error.Message != "No tenant send X-Tenant-ID" || w.Header().Get("Retry-After") != "" {
		t.Fatalf("stripe problem: %d %s %v (%v)", w.Code, w.Body, w.Header(), err)
	}
}

// A declared Content-Length does not make the server reserve memory the
// client never sends: the buffer grows as bytes arrive.
func TestBodyBufferGrowsAsBytesArrive(t *testing.T) {
	r := httptest.NewRequest("POST", "/x", io.MultiReader(strings.NewReader("0123456789"), iotestErrReader{}))
	r.ContentLength = 1 << 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := idem.ReadBody(r, 1<<20)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a body cut short was read whole")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<10 {
		t.Fatalf("reading 10 bytes of a declared MiB allocated %d bytes", grew)
	}
	// A body that arrives whole is read whole.
	big := strings.Repeat("y", 100<<10)
	r = httptest.NewRequest("POST", "/x", strings.NewReader(big))
	if b, err := idem.ReadBody(r, 1<<20); err != nil || string(b) != big {
		t.Fatalf("100 KiB body: %d bytes, %v", len(b), err)
	}
}

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// A framework that keeps the writer and writes after the middleware
// returned (echo's error handler under echo.WrapMiddleware) must neither
// crash the engine nor write into another request's answer: its late
// output reaches its own client, and the record keeps what the handler
// wrote while it ran.
func TestWriterUsedAfterTheHandlerReturned(t *testing.T) {
	t.Parallel()
	var kept http.ResponseWriter
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kept = w // returns without an answer, as an erroring echo handler does
	}))
	late := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "late-1")
	h.ServeHTTP(late, r)
	// The framework writes its error answer now.
	kept.Header().Set("Content-Type", "text/plain")
	kept.WriteHeader(http.StatusBadRequest)
	io.WriteString(kept, "late error")

	// Another request runs meanwhile: its answer is its own.
	other := httptest.NewRecorder()
	r2 := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
	r2.Header.Set("Idempotency-Key", "other-1")
	e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "mine")
	})).ServeHTTP(other, r2)
	io.WriteString(kept, " more")
	if other.Code != http.StatusCreated || other.Body.String() != "mine" {
		t.Fatalf("the other request got %d %q", other.Code, other.Body)
	}
	if got := late.Body.String(); got != "late error more" {
		t.Fatalf("late output %q, want it on its own client", got)
	}
	// The record holds what the handler wrote while it ran: an empty 200.
	replay := httptest.NewRecorder()
	r3 := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
	r3.Header.Set("Idempotency-Key", "late-1")
	h.ServeHTTP(replay, r3)
	if replay.Code != http.StatusOK || replay.Body.Len() != 0 || replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %d %q %v", replay.Code, replay.Body, replay.Header())
	}
}

// TestForwardedBodyInOneWrite: a handler that forwards the body it is
// given with an http.Client sends it in the same write as the request's
// head: the middleware hands on a body net/http knows to be in memory.
func TestForwardedBodyInOneWrite(t *testing.T) {
	t.Parallel()
	for _, size := range []int{300, 3000} {
		body := `{"note":"` + strings.Repeat("x", size-11) + `"}`
		up := wirecount.NewUpstream(t)
		f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
			out, err := http.NewRequestWithContext(r.Context(), http.MethodPost, up.URL, r.Body)
			if err != nil {
				t.Error(err)
				return
			}
			out.ContentLength = r.ContentLength
			resp, err := up.Transport.RoundTrip(out)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
		})
		if w := f.do(post(`"k`+strconv.Itoa(size)+`"`, body)); w.Code != http.StatusCreated {
			t.Fatalf("%d bytes: %d %s", size, w.Code, w.Body)
		}
		if got := up.Body(); got != body {
			t.Errorf("%d bytes: the upstream got %q", size, got)
		}
		if n := up.Writes(); n != 1 {
			t.Errorf("%d bytes: the request took %d writes; want 1 (head and body together)", size, n)
		}
	}
}

// Two duplicates wait (Config.Wait 10s) for a first execution that is
// released (503), and read it back in one shared read. Both then ask the
// store again: one reclaims the key and runs the request again; the other,
// finding it in progress again, waits for that execution's answer as it
// did for the first one's (it used to answer 409 at once, with nearly all
// of its wait left).
func TestWaiterWaitsForTheWaiterThatReclaimed(t *testing.T) {
	t.Parallel()
	s := &enginetest.Flaky{Store: memory.New(memory.Config{}), GetGate: make(chan struct{})}
	e, err := idem.New(s, idem.Config{Wait: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	entered := make(chan int64, 2)
	release := [3]chan struct{}{nil, make(chan struct{}), make(chan struct{})}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		entered <- n
		<-release[n]
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- sendKeyed(h, "k") }()
	<-entered
	dups := make(chan *httptest.ResponseRecorder, 2)
	for range 2 {
		go func() { dups <- sendKeyed(h, "k") }()
	}
	// Both duplicates found the key in progress; the first one's read is
	// held, and the other joins it.
	for s.Reserves.Load() < 3 || s.Gets.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	close(release[1]) // the first answers 503: released
	if w := <-first; w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", w.Code)
	}
	close(s.GetGate) // both read the released record
	if n := <-entered; n != 2 {
		t.Fatalf("execution %d", n)
	}
	select {
	case w := <-dups:
		close(release[2])
		t.Fatalf("a waiting duplicate answered %d %q while the second execution ran, most of its wait left", w.Code, w.Body)
	case <-time.After(300 * time.Millisecond):
	}
	close(release[2])
	for range 2 {
		if w := <-dups; w.Code != http.StatusCreated || w.Body.String() != "made" {
			t.Fatalf("duplicate: %d %q", w.Code, w.Body)
		}
	}
}

// NotExecuted releases the key whatever the answer, even one that
// StoreServerErrors keeps; an Uncertain declaration, before or after it,
// wins.
func TestNotExecutedReleases(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		declare func(x *idem.Execution)
		want    store.State
	}{
		"not executed":          {func(x *idem.Execution) { x.NotExecuted("connection refused") }, store.StateFailedRetryable},
		"uncertain first":       {func(x *idem.Execution) { x.Uncertain("timed out"); x.NotExecuted("refused") }, store.StateUnknown},
		"uncertain after":       {func(x *idem.Execution) { x.NotExecuted("refused"); x.Uncertain("timed out") }, store.StateUnknown},
		"neither (kept as 502)": {func(*idem.Execution) {}, store.StateCompleted},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, idem.Config{StoreServerErrors: true}, func(w http.ResponseWriter, r *http.Request) {
				tc.declare(idem.FromContext(r.Context()))
				w.WriteHeader(http.StatusBadGateway)
			})
			f.do(post(uuid, `{}`))
			rec, err := f.store.Get(context.Background(), "0:POST /v1/charges", strings.Trim(uuid, `"`))
			if err != nil || rec.State != tc.want {
				t.Fatalf("record: %s %v, want %s", rec.State, err, tc.want)
			}
		})
	}
}
