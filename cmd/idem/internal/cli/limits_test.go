package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/mysqldb"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// rawRequest writes head (request line and headers, without the blank
// line) and body on a new connection to the proxy at base, and returns the
// connection; the body is written in the background so that a server that
// answers early is read.
func rawRequest(t *testing.T, base, head string, body []byte) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		conn.Write([]byte(head + "\r\n\r\n"))
		conn.Write(body)
	}()
	return conn
}

// readAnswer reads one response from conn, giving up after 30s.
func readAnswer(t *testing.T, conn net.Conn) (*http.Response, string) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// What follows the answer: EOF when the server closed the connection.
	_, err = br.ReadByte()
	return resp, fmt.Sprint(err)
}

func TestProxyRefusesOversizedHeaders(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	_, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: "memory:"})
	// The limit is 64 KiB by default; a header of 1,000,000 bytes (net/http
	// alone takes up to 1 MiB) is refused.
	conn := rawRequest(t, base, "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"k\"\r\nContent-Length: 2\r\nX-Big: "+
		strings.Repeat("a", 1_000_000), []byte("{}"))
	resp, _ := readAnswer(t, conn)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("1,000,000-byte header: %d, want 431", resp.StatusCode)
	}
	// Under the limit it passes.
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "k2", `{}`, "X-Big", strings.Repeat("a", 60_000)); r.status != http.StatusCreated {
		t.Errorf("60,000-byte header: %d", r.status)
	}
	if api.calls.Load() != 1 {
		t.Errorf("upstream calls %d, want 1", api.calls.Load())
	}
}

// A client that stops sending its body is cut off at --body-timeout: it
// gets an answer, its connection is closed, the memory held for its body
// is given back, and nothing reaches the upstream.
func TestProxyCutsAStalledBody(t *testing.T) {
	t.Parallel()
	for _, method := range []string{"POST", "PUT"} { // protected, and passed through
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			api := &chargeAPI{}
			p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: "memory:", BodyTimeout: 200 * time.Millisecond})
			conn := rawRequest(t, base, method+" /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"stall\"\r\n"+
				"Content-Type: application/octet-stream\r\nContent-Length: 1048576", []byte("only ten b"))
			resp, after := readAnswer(t, conn)
			if resp.StatusCode < 400 || resp.StatusCode == http.StatusServiceUnavailable {
				t.Errorf("stalled body: %d, want a 4xx or 502", resp.StatusCode)
			}
			if after != io.EOF.Error() {
				t.Errorf("after the answer to a stalled body the connection reads %q, want EOF (closed)", after)
			}
			if api.calls.Load() != 0 && method == "POST" {
				t.Errorf("a stalled body reached the upstream")
			}
			waitFor(t, "the body's memory to be given back", func() bool { return p.buffered.Load() == 0 })
		})
	}
}

// waitFor polls cond until it holds, failing the test after 20s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Bodies held at once are bounded: beyond --max-buffered-bytes a keyed
// request is answered 503 with Retry-After at once, instead of queueing.
func TestProxyBoundsBufferedBodies(t *testing.T) {
	t.Parallel()
	const body = 1 << 20
	api := &chargeAPI{}
	p, base := startProxy(t, ProxyConfig{
		Upstream:         newUpstream(t, api).URL,
		Store:            "memory:",
		MaxBufferedBytes: 4 * body,
		BodyTimeout:      time.Minute,
		Config:           idem.Config{MaxBodyBytes: body, RetryAfter: 4 * time.Second},
	})
	head := func(key string) string {
		return "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"" + key + "\"\r\n" +
			"Content-Type: application/octet-stream\r\nContent-Length: " + fmt.Sprint(body)
	}
	// Ten uploads of 1 MiB that stall after a few bytes: four fit.
	var held []net.Conn
	refused := 0
	for i := range 10 {
		conn := rawRequest(t, base, head(fmt.Sprint("big-", i)), []byte("stall"))
		if i < 4 {
			held = append(held, conn)
			waitFor(t, "the upload to be admitted", func() bool { return p.buffered.Load() == int64(i+1)*body })
			continue
		}
		resp, _ := readAnswer(t, conn)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "4" {
			t.Errorf("upload %d over the bound: %d Retry-After %q, want 503 with the proxy's Retry-After 4", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		refused++
		if n := p.buffered.Load(); n > 4*body {
			t.Fatalf("%d bytes held, over the bound of %d", n, 4*body)
		}
	}
	// A small keyed body does not fit either while the bound is full, but
	// requests that hold no body pass.
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "small", `{}`); r.status != http.StatusServiceUnavailable ||
		problemType(t, r) != idem.ProblemBase+"overloaded" {
		t.Errorf("small body at the bound: %d %s", r.status, r.body)
	}
	if r := send(t, c, "GET", base+"/v1/charges", "", ""); r.status != http.StatusCreated {
		t.Errorf("GET at the bound: %d", r.status)
	}
	// The stalled clients leave: their memory comes back and keyed
	// requests are served again.
	for _, conn := range held {
		conn.Close()
	}
	waitFor(t, "the held bodies to be released", func() bool { return p.buffered.Load() == 0 })
	if r := send(t, c, "POST", base+"/v1/charges", "small", `{}`); r.status != http.StatusCreated {
		t.Errorf("after the release: %d %s", r.status, r.body)
	}
	if refused != 6 {
		t.Errorf("%d uploads refused, want 6", refused)
	}
}

// A method in lower or mixed case never reaches the upstream: an upstream
// that compares methods without regard to case would run it unprotected.
func TestProxyRefusesLowerCaseMethods(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: "memory:"})
	c := client(t)
	for _, m := range []string{"post", "Post", "pOST", "patch", "get"} {
		r := send(t, c, m, base+"/v1/charges", "case-"+m, `{}`)
		if r.status != http.StatusBadRequest || problemType(t, r) != idem.ProblemBase+"method-not-upper-case" {
			t.Errorf("%s: %d %s, want 400 method-not-upper-case", m, r.status, r.body)
		}
	}
	if api.calls.Load() != 0 {
		t.Errorf("a lower-case method reached the upstream %d times", api.calls.Load())
	}
	if r := send(t, c, "POST", base+"/v1/charges", "case-post", `{}`); r.status != http.StatusCreated {
		t.Errorf("POST: %d", r.status)
	}
	if _, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "case-post"); err != nil {
		t.Errorf("POST left no record: %v", err)
	}
}

// Refusals are counted by reason on /metrics.
func TestProxyCountsRefusals(t *testing.T) {
	t.Parallel()
	p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, &chargeAPI{}).URL, Store: "memory:",
		Admin: "127.0.0.1:0", TenantFrom: []string{"authorization"}})
	c := client(t)
	send(t, c, "POST", base+"/v1/charges", "k", `{}`)
	send(t, c, "post", base+"/v1/charges", "k", `{}`)
	r := send(t, c, "GET", "http://"+p.AdminAddr().String()+"/metrics", "", "")
	for _, reason := range []string{"tenant-missing", "method-not-upper-case"} {
		if !strings.Contains(string(r.body), `idem_proxy_refused_total{otel_scope_name="github.com/idem-go/idem/cmd/idem/internal/cli"`) ||
			!strings.Contains(string(r.body), `reason="`+reason+`"} 1`) {
			t.Errorf("no count of %s refusals in:\n%s", reason, grepLines(string(r.body), "idem_proxy_refused"))
		}
	}
}

func TestProxyNeedsATenantSource(t *testing.T) {
	t.Parallel()
	_, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: "http://127.0.0.1:1", Store: "memory:"})
	if err == nil || !strings.Contains(err.Error(), "--tenant-from") || !strings.Contains(err.Error(), "--single-tenant") {
		t.Fatalf("no tenant source: %v, want a refusal naming --tenant-from and --single-tenant", err)
	}
	// A shared store needs the secret given: every proxy must hash alike.
	for _, dsn := range []string{"postgres://u@127.0.0.1:1/db", "mysql://u@127.0.0.1:1/db", "redis://127.0.0.1:1/0"} {
		_, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: "http://127.0.0.1:1", Store: dsn,
			TenantFrom: []string{"authorization"}})
		if err == nil || !strings.Contains(err.Error(), "--tenant-secret-file") || !strings.Contains(err.Error(), tenantSecretEnv) {
			t.Errorf("%s without a tenant secret: %v", dsn, err)
		}
	}
	// A trusted header alone hashes nothing: no secret needed.
	_, err = NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: "http://127.0.0.1:1",
		Store: "postgres://u@127.0.0.1:1/db", TenantFrom: []string{"trusted-header:X-Tenant"}, SingleTenant: true})
	if err == nil || !strings.Contains(err.Error(), "exclude") {
		t.Errorf("--single-tenant with a source: %v", err)
	}
	var stderr strings.Builder
	err = Run(context.Background(), []string{"proxy", "--upstream", "http://127.0.0.1:1", "--store", "memory:", "--listen", "127.0.0.1:0"}, io.Discard, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--tenant-from") {
		t.Errorf("idem proxy without a tenant source: %v", err)
	}
}

// With a SQLite file store and no secret given, the proxy creates one
// beside the database, readable by its owner only, and keeps using it: a
// restart keeps every tenant, so retries still replay.
func TestProxyTenantSecretBesideSQLite(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "idem.db")
	api := &chargeAPI{}
	up := newUpstream(t, api).URL
	cfg := ProxyConfig{Upstream: up, Store: "sqlite:" + db, TenantFrom: []string{"authorization"}}
	c := client(t)
	var first reply
	for i := range 2 {
		p, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Migrate: true, Upstream: cfg.Upstream,
			Store: cfg.Store, TenantFrom: cfg.TenantFrom, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Serve(ctx) }()
		r := send(t, c, "POST", "http://"+p.Addr().String()+"/v1/charges", "k", `{}`, "Authorization", "Bearer alice")
		if i == 0 {
			first = r
		} else if r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body) {
			t.Errorf("after a restart: %d %v, want a replay", r.status, r.header)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		c.CloseIdleConnections()
	}
	fi, err := os.Stat(db + ".tenant-secret")
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < minSecretBytes {
		t.Fatalf("secret file: %v %v", fi, err)
	}
	if api.calls.Load() != 1 {
		t.Errorf("upstream calls %d, want 1", api.calls.Load())
	}
}

// The engine refuses nothing in the scope the proxy builds for hostile
// targets: the proxy answers 400 or 414 itself, never a 503 from a store
// that choked on the bytes, and logs no error.
func TestProxyHostileTargets(t *testing.T) {
	t.Parallel()
	for _, sv := range sqlServers(t) {
		t.Run(sv.name, func(t *testing.T) {
			t.Parallel()
			api := &chargeAPI{}
			var log safeBuffer
			p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: sv.dsn(t),
				TenantFrom: []string{"trusted-header:X-Tenant"}, Logger: log.logger()})
			for _, tc := range []struct {
				name, target string
				want         int
			}{
				{"invalid UTF-8 in the query", "/v1/charges?q=\xff\xfe", http.StatusBadRequest},
				{"raw UTF-8 in the query", "/v1/charges?q=caf\xc3\xa9", http.StatusBadRequest},
				{"3,000-byte path", "/" + randomPath(3000), http.StatusRequestURITooLong},
				{"1,000-byte query", "/v1/charges?q=" + strings.Repeat("a", 1000), http.StatusRequestURITooLong},
			} {
				conn := rawRequest(t, base, "POST "+tc.target+" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"hostile\"\r\n"+
					"X-Tenant: acme\r\nContent-Type: application/json\r\nContent-Length: 2", []byte("{}"))
				resp, _ := readAnswer(t, conn)
				if resp.StatusCode != tc.want {
					t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
				}
			}
			// A hostile tenant id from the trusted header is refused too.
			c := client(t)
			if r := send(t, c, "POST", base+"/v1/charges", "hostile", `{}`, "X-Tenant", strings.Repeat("t", 300)); r.status != http.StatusBadRequest {
				t.Errorf("300-byte tenant: %d %s", r.status, r.body)
			}
			// Percent-encoded bytes and routes at the bound are fine.
			for _, target := range []string{"/v1/charges?q=%FF%FE", "/" + strings.Repeat("b", maxRouteBytes-1)} {
				if r := send(t, c, "POST", base+target, "ok", `{}`, "X-Tenant", "acme"); r.status != http.StatusCreated {
					t.Errorf("%.40s: %d %s", target, r.status, r.body)
				}
			}
			if api.calls.Load() != 2 {
				t.Errorf("upstream calls %d, want 2", api.calls.Load())
			}
			if s := log.String(); strings.Contains(s, "level=ERROR") {
				t.Errorf("errors logged:\n%s", s)
			}
			_, err := p.Store().Get(context.Background(), scopeOf("acme", "POST", "/v1/charges?q=%FF%FE"), "ok")
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Errorf("store: %v", err)
			}
		})
	}
}

func randomPath(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[(i*7919+13)%len(alphabet)]
	}
	return string(b)
}

// sqlServer is a SQL database server a test runs the proxy's store on.
type sqlServer struct {
	name string
	dsn  func(t *testing.T) string // a fresh, private store DSN
}

// sqlServers are the PostgreSQL and MySQL servers of the environment; a
// server that is not configured skips its subtest.
func sqlServers(t *testing.T) []sqlServer {
	return []sqlServer{
		{"postgres", func(t *testing.T) string {
			u, err := url.Parse(testenv.PostgresURL(t))
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("search_path", pgdb.Schema(t, u.String()))
			u.RawQuery = q.Encode()
			return u.String()
		}},
		{"mysql", func(t *testing.T) string {
			cfg, err := mysqldrv.ParseDSN(mysqldb.Database(t))
			if err != nil {
				t.Fatal(err)
			}
			u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
			if cfg.Passwd != "" {
				u.User = url.UserPassword(cfg.User, cfg.Passwd)
			} else {
				u.User = url.User(cfg.User)
			}
			return u.String()
		}},
	}
}

// safeBuffer collects a proxy's log for inspection.
type safeBuffer struct{ testenv.Buffer }

func (s *safeBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(s, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// readProblem reads one response from conn and its body.
func readProblem(t *testing.T, conn net.Conn) (*http.Response, string) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// Under an upstream with a base path, a path with a dot-segment is refused
// before anything is reserved or forwarded, keyed or not: the reverse proxy
// appends the path to the base as sent, and an upstream that resolves
// /api/../admin would serve a path outside its base. Without a base path
// such a request passes (TestProxyConfigFile).
func TestProxyRefusesDotSegmentsUnderBasePath(t *testing.T) {
	t.Parallel()
	var seen []string
	var mu sync.Mutex
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.RequestURI)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL + "/api", Store: "memory:"})
	for _, path := range []string{"/../admin", "/v1/./charges", "/v1/%2e%2e/admin", "/v1/%2E./admin", "/v1/..%5cadmin", "/v1/..%2fadmin", "/..",
		"/..;/admin", "/v1/..;x=1/admin", "/v1/%2e%2e;/admin", "/v1/.;/charges"} { // Tomcat and Jetty drop ";params" before resolving dots
		for _, head := range []string{"GET " + path + " HTTP/1.1\r\nHost: x", // unprotected: straight to the upstream otherwise
			"POST " + path + " HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"dots\"\r\nContent-Length: 2"} {
			resp, body := readProblem(t, rawRequest(t, base, head, []byte("{}")))
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "path-dot-segment") {
				t.Errorf("%.40q: %d %s, want 400 path-dot-segment", head, resp.StatusCode, body)
			}
		}
	}
	c := client(t)
	for _, path := range []string{"/v1/charges", "/v1/..charges", "/v1/ch..arges/.x", "/v1/charges;v=2"} {
		if r := send(t, c, "POST", base+path, "ok"+path, `{}`); r.status != http.StatusCreated {
			t.Errorf("POST %s: %d %s", path, r.status, r.body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"/api/v1/charges", "/api/v1/..charges", "/api/v1/ch..arges/.x", "/api/v1/charges;v=2"}; !slices.Equal(seen, want) {
		t.Errorf("upstream saw %q, want %q", seen, want)
	}
}

// A route (unprotected, with its own settings, or asynchronous) matches a
// path only when no segment of it, decoded, is a dot-segment: an upstream
// that decodes %2e or %2f, takes a backslash for a slash or drops ";params"
// before resolving dots (nginx, Tomcat) reads /v1/webhooks/%2e%2e/charges as
// /v1/charges, which must stay protected under the flags' settings.
func TestProxyRoutesSkipEncodedDotSegments(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	_, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: "memory:",
		Routes: []RouteConfig{{Pattern: "/v1/webhooks/", Unprotected: true}}, Async: []string{"POST /v1/reports/{id}"}})
	for _, path := range []string{"/v1/webhooks/%2e%2e/charges", "/v1/webhooks/.%2E/charges", "/v1/webhooks/..%2fcharges",
		"/v1/webhooks/..%5ccharges", "/v1/webhooks/..;/charges", "/v1/webhooks/..;x=1/charges"} {
		resp, body := readProblem(t, rawRequest(t, base, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2", []byte("{}")))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "key-missing") {
			t.Errorf("POST %s without a key: %d %s, want 400 key-missing", path, resp.StatusCode, body)
		}
	}
	if n := api.calls.Load(); n != 0 {
		t.Errorf("%d requests reached the upstream unprotected", n)
	}
	// Nor is such a path asynchronous: it is run at once, under the key.
	if r := send(t, client(t), "POST", base+"/v1/reports/%2e%2e", "dots", `{}`); r.status != http.StatusCreated {
		t.Errorf("keyed POST /v1/reports/%%2e%%2e: %d %s, want 201 from a synchronous run", r.status, r.body)
	}
	// The route still serves its own paths, dots inside a segment included.
	for _, path := range []string{"/v1/webhooks/x", "/v1/webhooks/..x", "/v1/webhooks/a;b=.."} {
		if r := send(t, client(t), "POST", base+path, "", `{}`); r.status != http.StatusCreated {
			t.Errorf("POST %s on the unprotected route: %d %s", path, r.status, r.body)
		}
	}
	if n := api.calls.Load(); n != 4 {
		t.Errorf("upstream calls %d, want 4", n)
	}
}
