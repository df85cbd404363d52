package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// eachStore runs f against a memory store and a fresh SQLite file.
func eachStore(t *testing.T, f func(t *testing.T, dsn string)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, "memory:")
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	})
}

// startProxy serves a proxy on a free loopback port until the test ends.
// It returns the proxy and its base URL.
func startProxy(t *testing.T, cfg ProxyConfig) (*Proxy, string) {
	t.Helper()
	p, base, _ := startStoppable(t, cfg)
	return p, base
}

// rawUpstream serves each connection with serve, byte by byte as a test
// writes it (answers net/http's server would not send), and returns its
// URL; the connection is closed when serve returns, the listener when
// the test ends.
func rawUpstream(t *testing.T, serve func(conn net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				serve(conn, bufio.NewReader(conn))
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// startStoppable is startProxy with a stop function (idempotent) that
// shuts the proxy down and waits for it. A config with no tenant source
// serves one trusted caller.
func startStoppable(t *testing.T, cfg ProxyConfig) (*Proxy, string, func()) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Migrate = true
	if len(cfg.TenantFrom) == 0 && cfg.TenantHeader == "" {
		cfg.SingleTenant = true // one test client
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	p, err := NewProxy(context.Background(), cfg)
	if err != nil {
		t.Fatalf("NewProxy: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return p, "http://" + p.Addr().String(), stop
}

// client returns an HTTP client whose connections close with the test.
func client(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// send makes one request; key and the headers in hdr (name, value pairs)
// are set when not empty.
func send(t *testing.T, c *http.Client, method, url, key, body string, hdr ...string) reply {
	t.Helper()
	r, err := trySend(context.Background(), c, method, url, key, body, hdr...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func trySend(ctx context.Context, c *http.Client, method, url, key, body string, hdr ...string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return reply{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// chargeAPI is an upstream that creates a numbered charge per call.
type chargeAPI struct {
	calls atomic.Int64
}

func (a *chargeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Charge", fmt.Sprintf("ch_%d", n))
	w.Header().Set("Set-Cookie", "session=secret")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ch_%d","method":%q,"uri":%q,"request":%q,"at":%q}`,
		n, r.Method, r.RequestURI, body, time.Now().Format(time.RFC3339Nano))
}

func newUpstream(t *testing.T, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

// problemType reads the type of a problem+json answer.
func problemType(t *testing.T, r reply) string {
	t.Helper()
	var p struct{ Type string }
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("answer %d is not JSON: %q", r.status, r.body)
	}
	return p.Type
}

func scopeOf(tenant, method, route string) string {
	r := idem.Request{Tenant: tenant, Method: method, Route: route}
	return r.Scope()
}

func TestProxyReplaysTheFirstAnswer(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		api := &chargeAPI{}
		up := newUpstream(t, api)
		_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: dsn})
		c := client(t)

		first := send(t, c, "POST", base+"/v1/charges", "k1", `{"amount":100}`)
		second := send(t, c, "POST", base+"/v1/charges", "k1", `{"amount":100}`)
		if n := api.calls.Load(); n != 1 {
			t.Fatalf("upstream called %d times, want 1", n)
		}
		if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("first answer: %d %v", first.status, first.header)
		}
		if second.status != first.status || !bytes.Equal(second.body, first.body) {
			t.Fatalf("replay differs:\n first  %d %q\n second %d %q", first.status, first.body, second.status, second.body)
		}
		if second.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay lacks Idempotent-Replayed: %v", second.header)
		}
		if got := second.header.Get("X-Charge"); got != "ch_1" {
			t.Errorf("replayed X-Charge = %q, want ch_1", got)
		}
		if got := second.header.Get("Set-Cookie"); got != "" {
			t.Errorf("replay carries Set-Cookie %q", got)
		}

		// The same key with another body is misuse, not a replay.
		if r := send(t, c, "POST", base+"/v1/charges", "k1", `{"amount":999}`); r.status != http.StatusUnprocessableEntity {
			t.Errorf("reused key with another body: %d, want 422", r.status)
		}
		// A different query is a different request for the upstream.
		if r := send(t, c, "POST", base+"/v1/charges?currency=eur", "k1", `{"amount":100}`); r.status != http.StatusCreated ||
			r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("same key on another query: %d %v, want a new execution", r.status, r.header)
		}
		if n := api.calls.Load(); n != 2 {
			t.Errorf("upstream called %d times, want 2", n)
		}
	})
}

func TestProxyConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		const n = 16
		release := make(chan struct{})
		var calls atomic.Int64
		up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			<-release
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"ch_1"}`)
		}))
		_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: dsn})
		c := client(t)

		results := make(chan reply, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				r, err := trySend(context.Background(), c, "POST", base+"/v1/charges", "dup", `{"amount":1}`)
				if err != nil {
					t.Error(err)
					r.status = -1
				}
				results <- r
			})
		}
		// While the one execution is held in the upstream, every duplicate
		// must be answered without it.
		var got []reply
		timeout := time.After(20 * time.Second)
		for len(got) < n-1 {
			select {
			case r := <-results:
				got = append(got, r)
			case <-timeout:
				close(release)
				wg.Wait()
				t.Fatalf("only %d of %d duplicates answered while the first was in flight (upstream calls: %d)",
					len(got), n-1, calls.Load())
			}
		}
		close(release)
		wg.Wait()
		got = append(got, <-results)

		counts := map[int]int{}
		for _, r := range got {
			counts[r.status]++
			if r.status >= 500 || r.status < 0 {
				t.Errorf("a duplicate got %d: %s", r.status, r.body)
			}
			if r.status == http.StatusConflict && problemType(t, r) != idem.ProblemBase+"request-in-progress" {
				t.Errorf("409 of type %q", problemType(t, r))
			}
		}
		if calls.Load() != 1 || counts[http.StatusCreated] != 1 || counts[http.StatusConflict] != n-1 {
			t.Errorf("upstream calls %d, answers by status %v; want 1 call, one 201 and %d 409", calls.Load(), counts, n-1)
		}
		// Once settled, a duplicate is a replay.
		if r := send(t, c, "POST", base+"/v1/charges", "dup", `{"amount":1}`); r.status != http.StatusCreated ||
			r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("after settling: %d %v", r.status, r.header)
		}
	})
}

// upstreamAt starts the charge API on addr, where nothing listened until
// now (an upstream coming up).
func upstreamAt(t *testing.T, addr string) *chargeAPI {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", addr, err)
	}
	api := &chargeAPI{}
	up := httptest.NewUnstartedServer(api)
	up.Listener.Close()
	up.Listener = ln
	up.Start()
	t.Cleanup(up.Close)
	return api
}

// With --store-server-errors (5xx answers kept, as Stripe's v1 API keeps
// them) a request that never reached the upstream is still released: its
// 502 is the proxy's, not the upstream's, and the retry runs once the
// upstream is up (it used to replay the 502 for the key's whole TTL).
func TestProxyUpstreamRefusedReleasesTheKeyWhenServerErrorsAreKept(t *testing.T) {
	t.Parallel()
	addr := testenv.FreeAddr(t)
	cfg := ProxyConfig{Upstream: "http://" + addr, Store: "memory:"}
	cfg.StoreServerErrors = true
	p, base := startProxy(t, cfg)
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":5}`); r.status != http.StatusBadGateway {
		t.Fatalf("refused upstream: %d %s, want 502", r.status, r.body)
	}
	rec, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "k")
	if err != nil || rec.State != store.StateFailedRetryable {
		t.Fatalf("record after a refused upstream: %s, %v; want failed_retryable (nothing was sent)", rec.State, err)
	}
	api := upstreamAt(t, addr)
	if r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":5}`); r.status != http.StatusCreated || api.calls.Load() != 1 {
		t.Fatalf("retry once the upstream is up: %d %s (replayed %q), upstream calls %d", r.status, r.body, r.header.Get("Idempotent-Replayed"), api.calls.Load())
	}
}

func TestProxyUpstreamRefusedReleasesTheKey(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		addr := testenv.FreeAddr(t)
		p, base := startProxy(t, ProxyConfig{Upstream: "http://" + addr, Store: dsn})
		c := client(t)

		r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":5}`)
		if r.status != http.StatusBadGateway {
			t.Fatalf("refused upstream: %d %s, want 502", r.status, r.body)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("502 Content-Type %q", ct)
		}
		if typ := problemType(t, r); typ != idem.ProblemBase+"upstream-unreachable" || r.header.Get("Retry-After") == "" {
			t.Errorf("refused upstream: problem %q, Retry-After %q; want upstream-unreachable with Retry-After", typ, r.header.Get("Retry-After"))
		}
		rec, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "k")
		if err != nil || rec.State != store.StateFailedRetryable {
			t.Fatalf("record after a refused upstream: %+v, %v; want failed_retryable", rec, err)
		}

		// The upstream comes up on that address: the retry runs.
		api := upstreamAt(t, addr)

		r = send(t, c, "POST", base+"/v1/charges", "k", `{"amount":5}`)
		if r.status != http.StatusCreated || api.calls.Load() != 1 {
			t.Fatalf("retry after the upstream came up: %d %s, upstream calls %d", r.status, r.body, api.calls.Load())
		}
		if r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":5}`); r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("third try is not a replay: %d %v", r.status, r.header)
		}
	})
}

// hangUp is an upstream that reads the request, counts it, and drops the
// connection without answering: the request was delivered, its outcome is
// unknown.
type hangUp struct {
	calls    atomic.Int64
	newConns atomic.Int64
	// connsAtFirst is newConns when the first request arrived.
	connsAtFirst atomic.Int64
}

func (h *hangUp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		io.WriteString(w, "warm")
		return
	}
	io.Copy(io.Discard, r.Body)
	if h.calls.Add(1) == 1 {
		h.connsAtFirst.Store(h.newConns.Load())
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

func (h *hangUp) start(t *testing.T) *httptest.Server {
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			h.newConns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func TestProxyUpstreamFailsAfterSend(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		up := &hangUp{}
		srv := up.start(t)
		p, base := startProxy(t, ProxyConfig{Upstream: srv.URL, Store: dsn})
		c := client(t)

		r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":7}`)
		if r.status != http.StatusBadGateway || problemType(t, r) != idem.ProblemBase+"upstream-failed" {
			t.Fatalf("upstream hung up: %d %s, want 502 upstream-failed", r.status, r.body)
		}
		for range 2 {
			r = send(t, c, "POST", base+"/v1/charges", "k", `{"amount":7}`)
			if r.status != http.StatusConflict || problemType(t, r) != idem.ProblemBase+"outcome-unknown" {
				t.Fatalf("retry: %d %s, want 409 outcome-unknown", r.status, r.body)
			}
			if r.header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
		}
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream called %d times, want 1", n)
		}
		rec, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "k")
		if err != nil || rec.State != store.StateUnknown || !strings.Contains(rec.LastError, "after the request was sent") {
			t.Fatalf("record: state %s last_error %q err %v; want unknown", rec.State, rec.LastError, err)
		}
	})
}

// cutUpstream answers 201 announcing 100 bytes, sends fragment, and
// closes the connection: an upstream that dies part way through its
// answer. calls counts the requests it took.
func cutUpstream(t *testing.T, fragment string) (up *httptest.Server, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	up = newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, fragment)
		http.NewResponseController(w).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	}))
	return up, calls
}

// An upstream that dies part way through its answer has executed the
// request: the record becomes unknown, and the retry does not run it again.
func TestProxyUpstreamDiesMidResponse(t *testing.T) {
	t.Parallel()
	up, calls := cutUpstream(t, `{"id":"ch_`)
	p, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:"})
	c := client(t)
	if r, err := trySend(context.Background(), c, "POST", base+"/v1/charges", "cut", `{}`); err == nil && len(r.body) == 100 {
		t.Fatalf("a cut answer arrived whole: %d %q", r.status, r.body)
	}
	r := send(t, c, "POST", base+"/v1/charges", "cut", `{}`)
	if r.status != http.StatusConflict || problemType(t, r) != idem.ProblemBase+"outcome-unknown" {
		t.Fatalf("retry: %d %s, want 409 outcome-unknown", r.status, r.body)
	}
	if calls.Load() != 1 {
		t.Errorf("upstream called %d times", calls.Load())
	}
	rec, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "cut")
	if err != nil || rec.State != store.StateUnknown {
		t.Errorf("record %s %q, %v", rec.State, rec.LastError, err)
	}
}

// net/http's Transport re-sends a request that carries an Idempotency-Key
// and no body when a reused connection fails after the write. The proxy
// must not let it: the upstream may have executed the first copy.
func TestProxyNoSilentResendOnReusedConnection(t *testing.T) {
	t.Parallel()
	up := &hangUp{}
	srv := up.start(t)
	_, base := startProxy(t, ProxyConfig{Upstream: srv.URL, Store: "memory:"})
	c := client(t)

	if r := send(t, c, "GET", base+"/warm", "", ""); r.status != http.StatusOK {
		t.Fatalf("warm-up: %d", r.status)
	}
	r := send(t, c, "POST", base+"/v1/capture", "empty-body", "")
	if r.status != http.StatusBadGateway {
		t.Fatalf("upstream hung up: %d %s, want 502", r.status, r.body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream received the POST %d times, want 1", n)
	}
	if up.connsAtFirst.Load() != 1 {
		t.Fatalf("the POST did not reuse the warm connection (%d connections): the test proves nothing", up.connsAtFirst.Load())
	}
	if r := send(t, c, "POST", base+"/v1/capture", "empty-body", ""); r.status != http.StatusConflict {
		t.Errorf("retry: %d, want 409", r.status)
	}
}

// The upstream still sees the key, under any spelling of its name.
func TestProxyForwardsTheKey(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Idempotency-Key")
	}))
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:"})
	send(t, client(t), "POST", base+"/x", "fwd", `{}`)
	if k := <-got; k != `"fwd"` {
		t.Errorf("upstream saw Idempotency-Key %q", k)
	}
}

func TestProxyClientLeavingDoesNotCutTheUpstream(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	finish := make(chan struct{})
	cut := make(chan struct{})
	var calls atomic.Int64
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		close(arrived)
		select {
		case <-finish:
		case <-r.Context().Done():
			close(cut)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"slow"}`)
	}))
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", Config: idem.Config{Wait: 10 * time.Second}})
	c := client(t)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := trySend(ctx, c, "POST", base+"/v1/slow", "gone", `{}`)
		errc <- err
	}()
	<-arrived
	cancel() // the client times out while the upstream works
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	// A proxy that passed the cancellation on would cut the upstream's
	// request within milliseconds; give it ample time to show.
	select {
	case <-cut:
		t.Fatal("the proxy cut the upstream call when the client left")
	case <-time.After(300 * time.Millisecond):
	}
	close(finish)
	// The retry waits for the running execution and gets its answer.
	r := send(t, c, "POST", base+"/v1/slow", "gone", `{}`)
	if r.status != http.StatusCreated || string(r.body) != `{"id":"slow"}` || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the client left: %d %s %v", r.status, r.body, r.header)
	}
	if calls.Load() != 1 {
		t.Errorf("upstream called %d times", calls.Load())
	}
}

func TestProxyTenants(t *testing.T) {
	t.Parallel()
	// Every source keeps two callers apart, and the same caller together.
	for _, tc := range []struct {
		name   string
		cfg    ProxyConfig
		header string
		a, b   string
	}{
		{"trusted header", ProxyConfig{TenantFrom: []string{"trusted-header:x-tenant-id"}}, "X-Tenant-ID", "acme", "globex"},
		{"deprecated tenant header", ProxyConfig{TenantHeader: "x-tenant-id"}, "X-Tenant-ID", "acme", "globex"},
		{"authorization", ProxyConfig{TenantFrom: []string{"authorization"}}, "Authorization", "Bearer alice", "Bearer bob"},
		{"api key header", ProxyConfig{TenantFrom: []string{"header:X-Api-Key"}}, "X-Api-Key", "k_alice", "k_bob"},
		{"cookie", ProxyConfig{TenantFrom: []string{"cookie:session"}}, "Cookie", "session=alice; theme=dark", "theme=dark; session=bob"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api := &chargeAPI{}
			tc.cfg.Upstream = newUpstream(t, api).URL
			tc.cfg.Store = "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
			p, base := startProxy(t, tc.cfg)
			c := client(t)
			a1 := send(t, c, "POST", base+"/v1/charges", "same", `{}`, tc.header, tc.a)
			b := send(t, c, "POST", base+"/v1/charges", "same", `{}`, tc.header, tc.b)
			a2 := send(t, c, "POST", base+"/v1/charges", "same", `{}`, tc.header, tc.a)
			if api.calls.Load() != 2 || b.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "" ||
				a2.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a1.body, a2.body) {
				t.Fatalf("calls %d; b %d replayed %q; a replayed %q", api.calls.Load(), b.status,
					b.header.Get("Idempotent-Replayed"), a2.header.Get("Idempotent-Replayed"))
			}
			// b cannot probe a's key with another body either: its own
			// record answers.
			if r := send(t, c, "POST", base+"/v1/charges", "same", `{"x":1}`, tc.header, tc.b); r.status != http.StatusUnprocessableEntity {
				t.Errorf("b reusing its key: %d", r.status)
			}
			// Without the source: 401, nothing reserved, nothing forwarded.
			r := send(t, c, "POST", base+"/v1/charges", "anon", `{}`)
			if r.status != http.StatusUnauthorized || problemType(t, r) != idem.ProblemBase+"tenant-missing" ||
				r.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("no tenant source: %d %s", r.status, r.body)
			}
			if api.calls.Load() != 2 {
				t.Errorf("a request without a tenant reached the upstream")
			}
			if _, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "anon"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("a request without a tenant left a record: %v", err)
			}
			// Unkeyed and unprotected requests do not need a tenant.
			if r := send(t, c, "GET", base+"/v1/charges", "", ""); r.status != http.StatusCreated {
				t.Errorf("GET without a tenant: %d", r.status)
			}
		})
	}
}

// The credentials never reach the store or the log: only their keyed hash.
func TestProxyTenantCredentialsStayOut(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	var mu sync.Mutex
	api := &chargeAPI{}
	p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: "memory:",
		TenantFrom: []string{"header:X-Api-Key"}, TenantSecret: []byte("0123456789abcdef0123"),
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &log, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	c := client(t)
	send(t, c, "POST", base+"/v1/charges", "k", `{}`, "X-Api-Key", "sk_live_SECRET")
	tn := &tenants{sources: []tenantSource{{kind: srcHeader, name: "X-Api-Key"}}, secret: []byte("0123456789abcdef0123")}
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Api-Key", "sk_live_SECRET")
	want, _ := tn.tenant(r)
	rec, err := p.Store().Get(context.Background(), scopeOf(want, "POST", "/v1/charges"), "k")
	if err != nil || strings.Contains(rec.Scope, "SECRET") || !strings.HasPrefix(rec.Scope, fmt.Sprintf("%d:header:x-api-key:", len(want))) {
		t.Errorf("record %q: %v", rec.Scope, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(log.String(), "SECRET") {
		t.Errorf("the credential is in the log:\n%s", log.String())
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func TestTenantHashKeepsCredentialsOut(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("Authorization", "Bearer s3cret")
	auth := &tenants{sources: []tenantSource{{kind: srcAuthorization}}, secret: []byte("k1-0123456789abcdef")}
	got, err := auth.tenant(r)
	if err != nil || strings.Contains(got, "s3cret") || !strings.HasPrefix(got, "auth:") || len(got) != len("auth:")+32 {
		t.Errorf("tenant %q, %v", got, err)
	}
	// The hash is keyed: another secret gives another id, and it is not
	// the bare SHA-256 of the credential.
	other := &tenants{sources: auth.sources, secret: []byte("k2-0123456789abcdef")}
	if o, _ := other.tenant(r); o == got {
		t.Errorf("two secrets give one tenant %q", o)
	}
	bare := sha256.Sum256([]byte("Bearer s3cret"))
	if strings.Contains(got, hex.EncodeToString(bare[:16])) {
		t.Error("the tenant is an unkeyed SHA-256 of the credential")
	}
	if _, err := auth.tenant(httptest.NewRequest("POST", "/", nil)); !errors.Is(err, errNoTenant) {
		t.Errorf("tenant without Authorization: %v, want errNoTenant", err)
	}
}

func TestParseTenantSources(t *testing.T) {
	t.Parallel()
	got, err := parseTenantSources([]string{"authorization, cookie:sid", "header:x-api-key", "trusted-header:X-Tenant-ID", "authorization"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range got {
		names = append(names, s.String())
	}
	if strings.Join(names, " ") != "authorization cookie:sid header:X-Api-Key trusted-header:X-Tenant-Id" {
		t.Errorf("sources %q", names)
	}
	for _, bad := range []string{"basic", "header:", "cookie:", "header:a b", "authorization:x", "header:Authorization",
		"trusted-header:Cookie", "header:" + strings.Repeat("x", 65)} {
		if _, err := parseTenantSources([]string{bad}); err == nil {
			t.Errorf("source %q accepted", bad)
		}
	}
}

func TestProxyGetPassesThrough(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		api := &chargeAPI{}
		up := newUpstream(t, api)
		p, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: dsn})
		c := client(t)
		for range 2 {
			r := send(t, c, "GET", base+"/v1/charges/ch_1", "k", "")
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("GET: %d %v", r.status, r.header)
			}
		}
		// A GET without a key is not refused either.
		send(t, c, "GET", base+"/v1/charges/ch_1", "", "")
		if api.calls.Load() != 3 {
			t.Errorf("upstream called %d times, want 3", api.calls.Load())
		}
		_, err := p.Store().Get(context.Background(), scopeOf("", "GET", "/v1/charges/ch_1"), "k")
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a GET left a record: %v", err)
		}
	})
}

func TestProxyUnsupportedStore(t *testing.T) {
	t.Parallel()
	_, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: "http://127.0.0.1:1", Store: "etcd://x"})
	if !errors.Is(err, storeurl.ErrUnsupported) || !strings.Contains(err.Error(), "sqlite:PATH") {
		t.Fatalf("NewProxy: %v", err)
	}
	var stderr bytes.Buffer
	// From the command line it is a refused configuration: exit status 2.
	err = Run(context.Background(), []string{"proxy", "--upstream", "http://127.0.0.1:1", "--store", "etcd://x"}, io.Discard, &stderr)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "unsupported store DSN") {
		t.Fatalf("Run: %v", err)
	}
}

func TestProxyAdminAndShutdown(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{})
	p, err := NewProxy(context.Background(), ProxyConfig{
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Upstream: up.URL, Migrate: true, SingleTenant: true,
		Store:  "sqlite:" + filepath.Join(t.TempDir(), "idem.db"),
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		AdminHandlers: map[string]http.Handler{"GET /metrics": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "idem_up 1\n")
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	c := client(t)
	admin := "http://" + p.AdminAddr().String()
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "idem_up 1"} {
		r := send(t, c, "GET", admin+path, "", "")
		if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != want {
			t.Errorf("%s: %d %q", path, r.status, r.body)
		}
	}
	if r := send(t, c, "POST", "http://"+p.Addr().String()+"/v1/charges", "k", `{}`); r.status != http.StatusCreated {
		t.Errorf("proxy: %d", r.status)
	}

	cancel() // what SIGTERM does through signal.NotifyContext
	if err := <-done; err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
	if err := p.Store().Ping(context.Background()); err == nil {
		t.Error("the store is still open after shutdown")
	}
	if _, err := c.Get("http://" + p.Addr().String() + "/"); err == nil {
		t.Error("the proxy still answers after shutdown")
	}
}

func TestReadyzReportsAStoreFailure(t *testing.T) {
	t.Parallel()
	s, err := storeurl.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), storeurl.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	mux := AdminMux(s.Ping, nil)
	get := func(path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		return w
	}
	if w := get("/readyz"); w.Code != http.StatusOK {
		t.Fatalf("readyz with a live store: %d %s", w.Code, w.Body)
	}
	s.Close()
	if w := get("/readyz"); w.Code != http.StatusServiceUnavailable || !strings.HasPrefix(w.Body.String(), "not ready:") {
		t.Errorf("readyz with a closed store: %d %s", w.Code, w.Body)
	}
	if w := get("/healthz"); w.Code != http.StatusOK {
		t.Errorf("healthz: %d", w.Code)
	}
}

func TestRunProxyStopsOnCancel(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stderr bytes.Buffer
	err := Run(ctx, []string{"proxy", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream", up.URL,
		"--store", "memory:", "--single-tenant", "--log-format", "json"}, io.Discard, &stderr)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, stderr.String())
	}
	var start struct{ Msg, Listen, Upstream, Store string }
	line, _, _ := strings.Cut(stderr.String(), "\n")
	if err := json.Unmarshal([]byte(line), &start); err != nil || start.Msg != "idem proxy listening" ||
		start.Store != "memory" || start.Upstream != up.URL || !strings.HasPrefix(start.Listen, "127.0.0.1:") {
		t.Errorf("start log %q: %+v %v", line, start, err)
	}
}

func TestParseProxyFlags(t *testing.T) {
	t.Parallel()
	cfg, format, level, err := parseProxyFlags([]string{
		"--upstream", "http://127.0.0.1:3000", "--methods", "post, put", "--max-body", "2MiB",
		"--tenant-header", "X-Tenant-ID", "--ttl", "1h", "--lease", "10s", "--wait", "2s",
		"--profile", "stripe", "--upstream-timeout", "0", "--log-level", "debug",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Methods, ","); got != "POST,PUT" {
		t.Errorf("methods %q", got)
	}
	if cfg.MaxBodyBytes != 2<<20 || cfg.TenantHeader != "X-Tenant-ID" || cfg.TTL != time.Hour || cfg.Lease != 10*time.Second ||
		cfg.Wait != 2*time.Second || cfg.Profile != "stripe" || cfg.UpstreamTimeout >= 0 || !cfg.Migrate ||
		cfg.Store != storeurl.Default || cfg.Listen != "127.0.0.1:8080" || format != "text" || level != "debug" {
		t.Errorf("parsed %+v %s %s", cfg, format, level)
	}
	for _, args := range [][]string{
		{}, // no upstream
		{"--upstream", "http://x", "extra"},
		{"--upstream", "http://x", "--max-body", "-1"},
		{"--upstream", "http://x", "--nope"},
	} {
		if _, _, _, err := parseProxyFlags(args, io.Discard); !errors.Is(err, ErrUsage) {
			t.Errorf("parseProxyFlags(%q) = %v, want ErrUsage", args, err)
		}
	}
	if _, err := NewProxy(context.Background(), ProxyConfig{Upstream: "ftp://x", Store: "memory:"}); err == nil {
		t.Error("an ftp upstream was accepted")
	}
	if _, err := NewProxy(context.Background(), ProxyConfig{Upstream: "http://x", Store: "memory:", Listen: "127.0.0.1:0", Config: idem.Config{Profile: "soap"}}); err == nil {
		t.Error("an unknown profile was accepted")
	}
}

// Under the stripe profile the proxy's own answers say whether Stripe's
// SDKs should retry them: an upstream it could not reach (nothing ran)
// yes, an upstream that failed after the request was sent (outcome
// unknown) and a refused request no.
func TestProxyStripeShouldRetry(t *testing.T) {
	t.Parallel()
	c := client(t)
	stripeCode := func(t *testing.T, r reply) string {
		t.Helper()
		var doc struct{ Error struct{ Code string } }
		if err := json.Unmarshal(r.body, &doc); err != nil {
			t.Fatalf("%d %s: %v", r.status, r.body, err)
		}
		return doc.Error.Code
	}
	_, refused := startProxy(t, ProxyConfig{Upstream: "http://" + testenv.FreeAddr(t), Store: "memory:", Config: idem.Config{Profile: "stripe"}})
	r := send(t, c, "POST", refused+"/v1/charges", "k", `{}`)
	if r.status != http.StatusBadGateway || stripeCode(t, r) != "upstream-unreachable" || r.header.Get("Stripe-Should-Retry") != "true" {
		t.Errorf("unreachable upstream: %d %s, Stripe-Should-Retry %q", r.status, r.body, r.header.Get("Stripe-Should-Retry"))
	}
	if r := send(t, c, "post", refused+"/v1/charges", "k2", `{}`); r.status != http.StatusBadRequest || r.header.Get("Stripe-Should-Retry") != "false" {
		t.Errorf("lower-case method: %d %s, Stripe-Should-Retry %q", r.status, r.body, r.header.Get("Stripe-Should-Retry"))
	}
	_, hung := startProxy(t, ProxyConfig{Upstream: (&hangUp{}).start(t).URL, Store: "memory:", Config: idem.Config{Profile: "stripe"}})
	r = send(t, c, "POST", hung+"/v1/charges", "k", `{}`)
	if r.status != http.StatusBadGateway || stripeCode(t, r) != "upstream-failed" || r.header.Get("Stripe-Should-Retry") != "false" {
		t.Errorf("upstream hung up: %d %s, Stripe-Should-Retry %q", r.status, r.body, r.header.Get("Stripe-Should-Retry"))
	}
	// Its retry gets the engine's outcome-unknown, final too.
	r = send(t, c, "POST", hung+"/v1/charges", "k", `{}`)
	if r.status != http.StatusConflict || stripeCode(t, r) != "outcome-unknown" || r.header.Get("Stripe-Should-Retry") != "false" {
		t.Errorf("retry after the hang-up: %d %s, Stripe-Should-Retry %q", r.status, r.body, r.header.Get("Stripe-Should-Retry"))
	}
}

// An upstream answer without a length (chunked) makes the reverse proxy
// flush after every write; under a key the answer still reaches the
// client only once it is stored, and its retry replays it. (Each flush
// used to send the answer as written, before its record was stored.)
func TestProxyChunkedAnswerStoredBeforeItIsSent(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	var calls atomic.Int64
	upstream := rawUpstream(t, func(conn net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		calls.Add(1)
		chunk := `{"id":"ch_1"}`
		fmt.Fprintf(conn, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(chunk), chunk)
		<-hold // the last chunk comes later
		fmt.Fprintf(conn, "0\r\n\r\n")
	})
	p, base := startProxy(t, ProxyConfig{Upstream: upstream, Store: "memory:"})
	c := client(t)
	headers := make(chan *http.Response, 1) // as soon as the answer's header arrives
	go func() {
		req, _ := http.NewRequest("POST", base+"/v1/charges", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"c1"`)
		resp, err := c.Do(req)
		if err != nil {
			t.Error(err)
			close(headers)
			return
		}
		headers <- resp
	}()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case resp := <-headers:
		rec, _ := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "c1")
		t.Fatalf("the client got %v while the record is %s", resp.Status, rec.State)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	resp := <-headers
	if resp == nil {
		t.Fatal("no answer")
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` {
		t.Fatalf("first answer: %d %q %v", resp.StatusCode, body, err)
	}
	r, err := trySend(context.Background(), c, "POST", base+"/v1/charges", "c1", `{"amount":1}`)
	if err != nil || r.status != http.StatusCreated || string(r.body) != `{"id":"ch_1"}` || calls.Load() != 1 {
		t.Fatalf("retry: %d %q %v, upstream calls %d", r.status, r.body, err, calls.Load())
	}
}

// A keyed request that offers to switch protocols (a websocket on POST,
// curl's h2c offer) is forwarded without the offer: what would travel on
// the switched connection could be neither stored nor replayed, and an
// upstream that switched used to leave the record unknown after it ran.
// The upstream answers in HTTP/1.1, and that answer is kept and replayed.
func TestProxyKeyedRequestDoesNotSwitchProtocols(t *testing.T) {
	t.Parallel()
	var calls, offers atomic.Int64
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Upgrade") != "" {
			offers.Add(1)
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + r.Header.Get("Upgrade") + "\r\n\r\n")
			brw.Flush()
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	p, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:"})
	c := client(t)
	for i := range 2 {
		r := send(t, c, "POST", base+"/v1/charges", "up", `{}`, "Connection", "Upgrade", "Upgrade", "websocket")
		if r.status != http.StatusCreated || string(r.body) != `{"id":"ch_1"}` || (i == 1) != (r.header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("attempt %d: %d %v %s, want the upstream's 201 (replayed the second time)", i+1, r.status, r.header, r.body)
		}
	}
	if calls.Load() != 1 || offers.Load() != 0 {
		t.Errorf("upstream called %d times, %d with an upgrade offer; want once, without", calls.Load(), offers.Load())
	}
	rec, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "up")
	if err != nil || rec.State != store.StateCompleted {
		t.Errorf("record %s %q, %v; want completed", rec.State, rec.LastError, err)
	}
	// Without a key the offer is the client's and the upstream's to settle.
	resp := rawRequest(t, base, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket", nil)
	if got, _ := readAnswer(t, resp); got.StatusCode != http.StatusSwitchingProtocols {
		t.Errorf("GET with an upgrade offer: %d, want 101 from the upstream", got.StatusCode)
	}
}

// An informational answer of the upstream (103 Early Hints, or 100
// Continue) reaches the client, and the final answer still carries what the
// engine set before the upstream was called: the reverse proxy empties the
// header map after relaying a 1xx, which used to drop the echoed key.
func TestProxyInformationalAnswerKeepsTheEchoedKey(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", Config: idem.Config{EchoKey: true}})
	conn := rawRequest(t, base, "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"eh\"\r\nContent-Type: application/json\r\nContent-Length: 2", []byte("{}"))
	resp, hints := finalAnswer(t, conn)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotency-Key") != `"eh"` || resp.Header.Get("Link") != "" {
		t.Errorf("first answer: %d %v, want 201 with the echoed key and without the hint's Link", resp.StatusCode, resp.Header)
	}
	if !slices.Equal(hints, []int{http.StatusEarlyHints}) {
		t.Errorf("the client saw the informational answers %v, want the upstream's 103", hints)
	}
	r := send(t, client(t), "POST", base+"/v1/charges", "eh", `{}`)
	if r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Idempotency-Key") != `"eh"` {
		t.Errorf("replay: %d %v", r.status, r.header)
	}
}

// finalAnswer reads the answer on conn after the informational ones, whose
// statuses it returns too, giving up after 30s.
func finalAnswer(t *testing.T, conn net.Conn) (*http.Response, []int) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	var informational []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if resp.StatusCode >= 200 {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp, informational
		}
		informational = append(informational, resp.StatusCode)
	}
}

// Under a key the proxy holds the whole body before it calls the upstream,
// so it does not pass the client's Expect: 100-continue on: an upstream
// that sends no 100 Continue (it need not) kept every such request waiting
// for the transport's ExpectContinueTimeout before its body was sent.
func TestProxyKeyedExpectContinue(t *testing.T) {
	t.Parallel()
	expects := make(chan string, 4)
	upstream := rawUpstream(t, func(conn net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			expects <- req.Header.Get("Expect")
			io.Copy(io.Discard, req.Body)
			io.WriteString(conn, "HTTP/1.1 201 Created\r\nContent-Length: 13\r\n\r\n{\"id\":\"ch_1\"}")
		}
	})
	p, base := startProxy(t, ProxyConfig{Upstream: upstream, Store: "memory:"})
	expectTimeout := p.transport.ExpectContinueTimeout
	for i := range 2 {
		start := time.Now()
		conn := rawRequest(t, base, "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"x\"\r\nExpect: 100-continue\r\n"+
			"Content-Type: application/json\r\nContent-Length: 2", []byte("{}"))
		resp, informational := finalAnswer(t, conn)
		took := time.Since(start)
		if resp.StatusCode != http.StatusCreated || (i == 1) != (resp.Header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("attempt %d: %d %v", i+1, resp.StatusCode, resp.Header)
		}
		if !slices.Equal(informational, []int{http.StatusContinue}) {
			t.Errorf("attempt %d: informational answers %v, want the one 100 Continue the client asked for", i+1, informational)
		}
		if took >= expectTimeout {
			t.Errorf("attempt %d took %v, as long as the transport waits for a 100 Continue (%v)", i+1, took, expectTimeout)
		}
	}
	if len(expects) != 1 {
		t.Fatalf("upstream called %d times, want 1", len(expects))
	}
	if e := <-expects; e != "" {
		t.Errorf("upstream saw Expect: %q", e)
	}
}
