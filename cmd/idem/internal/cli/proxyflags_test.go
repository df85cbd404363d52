package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// proxyFromFlags parses args as idem proxy's command line (with
// --upstream and an in-memory store added) and serves the proxy.
func proxyFromFlags(t *testing.T, upstream string, args ...string) (*Proxy, string) {
	t.Helper()
	args = append([]string{"--upstream", upstream, "--store", "memory:", "--single-tenant"}, args...)
	cfg, _, _, err := parseProxyFlags(args, io.Discard)
	if err != nil {
		t.Fatalf("parseProxyFlags(%q): %v", args, err)
	}
	return startProxy(t, cfg)
}

// statusAPI answers every request with status and a fixed body, counting
// the calls.
type statusAPI struct {
	status int
	body   string
	calls  atomic.Int64
}

func (a *statusAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.calls.Add(1)
	io.Copy(io.Discard, r.Body)
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

func TestProxyStoreServerErrorsFlag(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		api := &statusAPI{status: http.StatusInternalServerError, body: "boom"}
		args := []string{}
		if keep {
			args = append(args, "--store-server-errors")
		}
		_, base := proxyFromFlags(t, newUpstream(t, api).URL, args...)
		c := client(t)
		first := send(t, c, "POST", base+"/v1/charges", "k1", `{}`)
		second := send(t, c, "POST", base+"/v1/charges", "k1", `{}`)
		if first.status != 500 || second.status != 500 {
			t.Fatalf("store-server-errors=%v: answers %d, %d", keep, first.status, second.status)
		}
		want, replayed := int64(2), ""
		if keep {
			want, replayed = 1, "true"
		}
		if n := api.calls.Load(); n != want || second.header.Get("Idempotent-Replayed") != replayed {
			t.Errorf("store-server-errors=%v: upstream called %d times (want %d), retry replayed %q",
				keep, n, want, second.header.Get("Idempotent-Replayed"))
		}
	}
}

func TestProxyMaxResponseBytesFlag(t *testing.T) {
	t.Parallel()
	api := &statusAPI{status: http.StatusCreated, body: strings.Repeat("x", 100)}
	_, base := proxyFromFlags(t, newUpstream(t, api).URL, "--max-response-bytes", "64")
	c := client(t)
	first := send(t, c, "POST", base+"/v1/charges", "big", `{}`)
	second := send(t, c, "POST", base+"/v1/charges", "big", `{}`)
	if first.status != 201 || len(first.body) != 100 {
		t.Fatalf("first answer %d with %d bytes, want 201 with the whole body", first.status, len(first.body))
	}
	if second.status != 201 || second.header.Get("Idempotent-Body-Omitted") != "true" || len(second.body) != 0 {
		t.Errorf("replay: %d, omitted %q, %d bytes; want the status without the body", second.status,
			second.header.Get("Idempotent-Body-Omitted"), len(second.body))
	}
	if _, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--max-response-bytes", "-5"}, io.Discard); !errors.Is(err, ErrUsage) {
		t.Errorf("--max-response-bytes -5: %v, want a usage error", err)
	}
}

func TestProxyFieldsFlag(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	_, base := proxyFromFlags(t, newUpstream(t, api).URL, "--fields", "payment.amount,currency")
	c := client(t)
	first := send(t, c, "POST", base+"/v1/charges", "f1", `{"payment":{"amount":100},"currency":"eur","note":"a"}`)
	other := send(t, c, "POST", base+"/v1/charges", "f1", `{"note":"b","currency":"eur","payment":{"amount":100,"memo":"x"}}`)
	changed := send(t, c, "POST", base+"/v1/charges", "f1", `{"payment":{"amount":200},"currency":"eur","note":"a"}`)
	if first.status != 201 || other.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a change outside the fields: %d then %d (replayed %q), want a replay", first.status, other.status,
			other.header.Get("Idempotent-Replayed"))
	}
	if changed.status != http.StatusUnprocessableEntity {
		t.Errorf("payment.amount changed: %d, want 422", changed.status)
	}
	if n := api.calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
	_, errOut, err := run("proxy", "--upstream", "http://x", "--store", "memory:", "--single-tenant", "--fields", "a~2b")
	if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "a~2b") {
		t.Errorf("--fields a~2b: %v\n%s", err, errOut)
	}
}

// blockingAPI holds every request until release is closed, after telling
// arrived that it came.
type blockingAPI struct {
	arrived chan struct{}
	release chan struct{}
}

func newBlockingAPI() *blockingAPI {
	return &blockingAPI{arrived: make(chan struct{}, 16), release: make(chan struct{})}
}

func (a *blockingAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	a.arrived <- struct{}{}
	<-a.release
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"ch_1"}`)
}

func TestProxyInProgressStatusAndRetryAfterFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args        []string
		status      int
		retryAfter  string
		problemSlug string
	}{
		{nil, http.StatusConflict, "1", idem.SlugInProgress},
		{[]string{"--in-progress-status", "202", "--retry-after", "7s"}, http.StatusAccepted, "7", idem.SlugInProgress},
	} {
		api := newBlockingAPI()
		_, base := proxyFromFlags(t, newUpstream(t, api).URL, append([]string{"--wait", "0"}, tt.args...)...)
		c := client(t)
		done := make(chan reply, 1)
		go func() {
			r, _ := trySend(context.Background(), c, "POST", base+"/v1/charges", "slow", `{}`)
			done <- r
		}()
		<-api.arrived // the first request holds the key
		dup := send(t, c, "POST", base+"/v1/charges", "slow", `{}`)
		close(api.release)
		first := <-done
		if dup.status != tt.status || dup.header.Get("Retry-After") != tt.retryAfter {
			t.Errorf("%q: duplicate answered %d with Retry-After %q, want %d with %q", tt.args, dup.status,
				dup.header.Get("Retry-After"), tt.status, tt.retryAfter)
		}
		if got := problemType(t, dup); got != idem.ProblemBase+tt.problemSlug {
			t.Errorf("%q: duplicate's problem %q", tt.args, got)
		}
		if first.status != http.StatusCreated {
			t.Errorf("%q: first answer %d", tt.args, first.status)
		}
	}
	for _, bad := range [][]string{{"200"}, {"x"}, {"429"}, {"202", "--profile", "stripe"}, {"503", "--profile", "stripe"}} {
		_, errOut, err := run(append([]string{"proxy", "--upstream", "http://x", "--in-progress-status"}, bad...)...)
		if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "in-progress-status") {
			t.Errorf("--in-progress-status %s: %v\n%s", bad, err, errOut)
		}
	}
	_, errOut, _ := run("proxy", "--upstream", "http://x", "--profile", "stripe", "--in-progress-status", "202")
	if !strings.Contains(errOut, "Stripe's SDKs take any 2xx") {
		t.Errorf("202 with the stripe profile refused without saying why:\n%s", errOut)
	}
}

// By default a duplicate of a request in flight waits for it and gets its
// answer replayed, instead of a refusal to retry.
func TestProxyWaitsByDefault(t *testing.T) {
	t.Parallel()
	api := newBlockingAPI()
	_, base := proxyFromFlags(t, newUpstream(t, api).URL)
	c := client(t)
	first := make(chan reply, 1)
	go func() {
		r, _ := trySend(context.Background(), c, "POST", base+"/v1/charges", "slow", `{}`)
		first <- r
	}()
	<-api.arrived
	dup := make(chan reply, 1)
	go func() {
		r, _ := trySend(context.Background(), c, "POST", base+"/v1/charges", "slow", `{}`)
		dup <- r
	}()
	select {
	case r := <-dup:
		t.Fatalf("the duplicate was answered %d while the first was running", r.status)
	case <-time.After(300 * time.Millisecond):
	}
	close(api.release)
	f, d := <-first, <-dup
	if f.status != http.StatusCreated || d.status != http.StatusCreated || d.header.Get("Idempotent-Replayed") != "true" || string(d.body) != string(f.body) {
		t.Errorf("first %d %s, duplicate %d %s (replayed %q); want the first's answer replayed", f.status, f.body, d.status, d.body, d.header.Get("Idempotent-Replayed"))
	}
}

func TestProxyKeyFlags(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	_, base := proxyFromFlags(t, newUpstream(t, api).URL, "--key-required=false", "--key-reused-status", "409")
	c := client(t)
	// Without a key the request passes to the upstream under the ietf
	// profile, which would refuse it with 400.
	if r := send(t, c, "POST", base+"/v1/charges", "", `{"amount":1}`); r.status != http.StatusCreated {
		t.Errorf("keyless POST with --key-required=false: %d, want 201", r.status)
	}
	send(t, c, "POST", base+"/v1/charges", "k", `{"amount":1}`)
	if r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":2}`); r.status != http.StatusConflict {
		t.Errorf("reused key with --key-reused-status 409: %d", r.status)
	}
	if n := api.calls.Load(); n != 2 {
		t.Errorf("upstream called %d times, want 2", n)
	}
	// The profile decides when the flag is left alone.
	_, strict := proxyFromFlags(t, newUpstream(t, api).URL)
	if r := send(t, c, "POST", strict+"/v1/charges", "", `{}`); r.status != http.StatusBadRequest {
		t.Errorf("keyless POST under ietf: %d, want 400", r.status)
	}
	for _, args := range [][]string{
		{"--key-required=maybe"},
		{"--key-reused-status", "500"},
		{"--lease-policy", "sometimes"},
		{"--retry-after", "-1s"},
		{"--store-timeout", "-1s"},
	} {
		_, errOut, err := run(append([]string{"proxy", "--upstream", "http://x", "--store", "memory:", "--single-tenant"}, args...)...)
		if !errors.Is(err, ErrUsage) || errOut == "" {
			t.Errorf("%q: %v, want a usage error\n%s", args, err, errOut)
		}
	}
}

func TestProxyLeasePolicyAndStoreTimeoutFlags(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	p, base := proxyFromFlags(t, newUpstream(t, api).URL, "--lease-policy", "retry", "--store-timeout", "750ms", "--ttl", "90m")
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "lp", `{}`); r.status != http.StatusCreated {
		t.Fatalf("POST: %d", r.status)
	}
	rec, err := p.Store().Get(context.Background(), scopeOf("", "POST", "/v1/charges"), "lp")
	if err != nil {
		t.Fatal(err)
	}
	if rec.LeasePolicy != store.LeaseRetry {
		t.Errorf("record's lease policy %q, want retry", rec.LeasePolicy)
	}
	if ttl := rec.ExpiresAt.Sub(rec.CompletedAt); ttl != 90*time.Minute {
		t.Errorf("record kept for %v, want 90m", ttl)
	}
	p.mu.Lock()
	timeout := p.engine.StoreTimeout()
	p.mu.Unlock()
	if timeout != 750*time.Millisecond {
		t.Errorf("engine's store timeout %v, want 750ms", timeout)
	}
}

func TestProxyFlagDefaultsAreTheEngines(t *testing.T) {
	t.Parallel()
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TTL != idem.DefaultTTL || cfg.Lease != idem.DefaultLease || cfg.RetryAfter != idem.DefaultRetryAfter ||
		cfg.StoreTimeout != idem.DefaultStoreTimeout || cfg.MaxBodyBytes != idem.DefaultMaxBodyBytes ||
		cfg.MaxResponseBytes != idem.DefaultMaxResponseBytes || cfg.InProgressStatus != 0 || cfg.Wait != defaultWait ||
		cfg.KeyRequired != nil || cfg.KeyReusedStatus != 0 || cfg.LeasePolicy != store.LeaseUnknown ||
		cfg.Fields != nil || cfg.StoreServerErrors || cfg.KeyHeader != idem.DefaultKeyHeader {
		t.Errorf("defaults %+v", cfg)
	}
}

// With the store's table locked, a keyed request waits for the store no
// longer than --store-timeout: it is answered 503 before the upstream is
// called, while the lock is still held (released only after the answer).
// pgStore is the DSN of a PostgreSQL store in a new schema, and the schema.
func pgStore(t *testing.T) (*url.URL, string) {
	t.Helper()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	schema := pgdb.Schema(t, u.String())
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u, schema
}

func TestProxyStoreBatchesFlag(t *testing.T) {
	t.Parallel()
	u, _ := pgStore(t)
	api := &chargeAPI{}
	for _, c := range []struct {
		flag string
		want int
	}{{"0", postgres.DefaultMaxBatches}, {"4", 4}, {"-1", 0}} {
		p, base := proxyFromFlags(t, newUpstream(t, api).URL, "--store", u.String(), "--store-batches", c.flag,
			"--maintenance=false")
		s, ok := p.Store().(*postgres.Store)
		if !ok {
			t.Fatalf("the proxy's store is a %T", p.Store())
		}
		if got := s.MaxBatches(); got != c.want {
			t.Errorf("--store-batches %s: %d slots, want %d", c.flag, got, c.want)
		}
		if r := send(t, client(t), "POST", base+"/v1/charges", "batches-"+c.flag, `{}`); r.status != http.StatusCreated {
			t.Errorf("--store-batches %s: POST answered %d", c.flag, r.status)
		}
	}
	_, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--store", u.String(), "--single-tenant",
		"--store-batches", "-2"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--store-batches") {
		t.Errorf("--store-batches -2: %v, want an error naming the store batches", err)
	}
}

func TestProxyStoreTimeoutFlagOnALockedStore(t *testing.T) {
	t.Parallel()
	u, schema := pgStore(t)
	api := &chargeAPI{}
	p, base := proxyFromFlags(t, newUpstream(t, api).URL, "--store", u.String(), "--store-timeout", "300ms",
		"--maintenance=false")
	p.mu.Lock()
	timeout := p.engine.StoreTimeout()
	p.mu.Unlock()
	if timeout != 300*time.Millisecond {
		t.Fatalf("engine's store timeout %v, want 300ms", timeout)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, "idem_records"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	r := send(t, client(t), "POST", base+"/v1/charges", "locked", `{}`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Errorf("keyed request on a locked store: %d (Retry-After %q), want 503 with Retry-After", r.status, r.header.Get("Retry-After"))
	}
	if n := api.calls.Load(); n != 0 {
		t.Errorf("upstream called %d times while the store was locked", n)
	}
}

func TestProxyGCHeadroomFlag(t *testing.T) {
	for _, c := range []struct {
		flag string
		want int64
	}{{"", 32 << 20}, {"0", 0}, {"64MiB", 64 << 20}} {
		args := []string{"--upstream", "http://x", "--store", "memory:", "--single-tenant"}
		if c.flag != "" {
			args = append(args, "--gc-headroom", c.flag)
		}
		cfg, _, _, err := parseProxyFlags(args, io.Discard)
		if err != nil || cfg.GCHeadroom != c.want {
			t.Errorf("--gc-headroom %q: %d, %v; want %d", c.flag, cfg.GCHeadroom, err, c.want)
		}
	}
	if _, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--gc-headroom", "-1"}, io.Discard); !errors.Is(err, ErrUsage) {
		t.Errorf("--gc-headroom -1: %v, want a usage error", err)
	}

	// Started or not, and the collector's pace as the runtime reports it
	// after a collection (the floor adjusts it just after, on the
	// runtime's cleanup goroutine).
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	noGOGC := func(string) string { return "" }
	withGOGC := func(k string) string {
		if k == "GOGC" {
			return "150"
		}
		return ""
	}
	for _, c := range []struct {
		name     string
		headroom int64
		getenv   func(string) string
	}{{"--gc-headroom 0", 0, noGOGC}, {"GOGC set", 1 << 30, withGOGC}} {
		stop, started := paceCollector(c.headroom, c.getenv)
		if started {
			t.Errorf("%s: the collector's pace was changed, want Go's left alone", c.name)
		}
		stop()
	}
	percent := func() uint64 {
		s := []rtmetrics.Sample{{Name: "/gc/gogc:percent"}}
		rtmetrics.Read(s)
		return s[0].Value.Uint64()
	}
	// A headroom far above this test's heap: the pace slows.
	stop, started := paceCollector(1<<30, noGOGC)
	deadline := time.Now().Add(5 * time.Second)
	for percent() <= 100 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if p := percent(); !started || p <= 100 {
		t.Errorf("--gc-headroom 1GiB: started %v, GC percent %d after a collection; want more than 100", started, p)
	}
	stop()
	if p := percent(); p != 100 {
		t.Errorf("after the proxy stopped: GC percent %d, want the 100 it found", p)
	}
}
