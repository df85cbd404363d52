package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
)

// eventually polls cond every few milliseconds until it holds, failing the
// test after a bound far above what the condition needs.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// metricValue reads one sample of a Prometheus text exposition: the value
// of the series named name whose labels include every label given.
func metricValue(t *testing.T, exposition, name string, labels ...string) (float64, bool) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{([^}]*)\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(exposition, -1) {
		all := true
		for _, l := range labels {
			all = all && strings.Contains(","+m[1]+",", ","+l+",")
		}
		if all {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				t.Fatalf("%s: %v", m[0], err)
			}
			return v, true
		}
	}
	return 0, false
}

func TestProxyMetrics(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		up := newUpstream(t, &chargeAPI{})
		p, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: dsn, Admin: "127.0.0.1:0"})
		c := client(t)

		send(t, c, "POST", base+"/v1/charges", "m1", `{"amount":1}`) // created
		send(t, c, "POST", base+"/v1/charges", "m1", `{"amount":1}`) // replay
		send(t, c, "POST", base+"/v1/charges", "m1", `{"amount":1}`) // replay
		if r := send(t, c, "POST", base+"/v1/charges", "m1", `{"amount":2}`); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("key misuse: %d", r.status)
		}
		send(t, c, "POST", base+"/v1/charges", "m2", `{"amount":1}`) // created

		r := send(t, c, "GET", "http://"+p.AdminAddr().String()+"/metrics", "", "")
		if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
			t.Fatalf("/metrics: %d %v", r.status, r.header)
		}
		text := string(r.body)
		for outcome, want := range map[string]float64{"created": 2, "replay": 2, "key_reused": 1} {
			got, ok := metricValue(t, text, "idem_reserve_outcomes_total", `outcome="`+outcome+`"`)
			if !ok || got != want {
				t.Errorf("idem_reserve_outcomes_total{outcome=%q} = %v (found %v), want %v", outcome, got, ok, want)
			}
		}
		if _, ok := metricValue(t, text, "idem_reserve_outcomes_total", `outcome="in_progress"`); ok {
			t.Error("an outcome that never happened has a series")
		}
		// Store latency in seconds, with bounds for sub-millisecond calls.
		if n, ok := metricValue(t, text, "idem_store_duration_seconds_count", `op="reserve"`); !ok || n != 5 {
			t.Errorf("reserve latency count %v (found %v), want 5", n, ok)
		}
		if _, ok := metricValue(t, text, "idem_store_duration_seconds_bucket", `op="reserve"`, `le="0.001"`); !ok {
			t.Errorf("no sub-millisecond bucket:\n%s", grepLines(text, "idem_store_duration_seconds_bucket"))
		}
		for _, series := range []string{"go_goroutines", "process_cpu_seconds_total", `target_info{`} {
			if !strings.Contains(text, series) {
				t.Errorf("/metrics lacks %s", series)
			}
		}
	})
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// testClock is a store clock a test moves by hand.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func TestProxySweepsAndReapsInTheBackground(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		clock := newTestClock()
		up := newUpstream(t, &chargeAPI{})
		p, _ := startProxy(t, ProxyConfig{Upstream: up.URL, Store: dsn, StoreClock: clock.now, Admin: "127.0.0.1:0",
			Maintenance: maintenance.Config{SweepInterval: 5 * time.Millisecond, ReapInterval: 5 * time.Millisecond}})
		s := p.Store()
		ctx := context.Background()
		// A holder that died (nobody renews its lease), and a completed
		// record about to expire.
		res, err := s.Reserve(ctx, store.ReserveParams{Scope: testScope, Key: "zombie", Fingerprint: "fp",
			Lease: time.Second, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
		if err != nil || res.Outcome != store.Created {
			t.Fatal(res.Outcome, err)
		}
		completedRecord(t, s, "old", time.Minute)
		clock.advance(2 * time.Minute)
		eventually(t, "the sweeper to move the zombie to unknown", func() bool { return stateOf(t, s, "zombie") == store.StateUnknown })
		eventually(t, "the reaper to delete the expired record", func() bool { return stateOf(t, s, "old") == "absent" })
		// The services' metrics are served beside the engine's, under the
		// names they always had.
		c := client(t)
		eventually(t, "the services' metrics", func() bool {
			text := string(send(t, c, "GET", "http://"+p.AdminAddr().String()+"/metrics", "", "").body)
			swept, _ := metricValue(t, text, "idem_zombies_swept_total")
			pruned, _ := metricValue(t, text, "idem_ttl_pruned_total")
			_, sweeps := metricValue(t, text, "idem_store_duration_seconds_count", `op="sweep"`)
			_, reaps := metricValue(t, text, "idem_store_duration_seconds_count", `op="reap"`)
			return swept == 1 && pruned == 1 && sweeps && reaps
		})
	})
}

func TestProxyWithoutMaintenance(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{})
	p, _ := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", NoMaintenance: true})
	if p.maint != nil {
		t.Fatal("the background services run with NoMaintenance")
	}
	_, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: up.URL, Store: "memory:",
		NoMaintenance: true, ResolveURL: "http://127.0.0.1:1/resolve", SingleTenant: true})
	if err == nil || !strings.Contains(err.Error(), "--resolve-url needs the background services") {
		t.Errorf("a resolver without the services: %v", err)
	}
}

// A maintenance configuration no default can mend stops the proxy before
// it listens.
func TestProxyRefusesABadMaintenanceConfig(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{})
	_, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: up.URL, Store: "memory:", SingleTenant: true,
		Maintenance: maintenance.Config{ReconcileBackoff: 2 * time.Hour}})
	if err == nil || !strings.Contains(err.Error(), "ReconcileMaxBackoff (1h0m0s) is shorter than ReconcileBackoff (2h0m0s)") {
		t.Fatalf("NewProxy: %v", err)
	}
}

// The proxy's reconciler settles an unknown request through the resolve
// URL, and the retry replays what the upstream's operators said happened.
func TestProxyReconcilesThroughTheResolveURL(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, dsn string) {
		up := &hangUp{}
		srv := up.start(t)
		api := &resolverAPI{answers: map[string]string{
			"k": `{"outcome":"happened","status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ch_r\"}"}`,
		}}
		resolver := newUpstream(t, api)
		p, base := startProxy(t, ProxyConfig{Upstream: srv.URL, Store: dsn, ResolveURL: resolver.URL,
			Maintenance: maintenance.Config{ReconcileInterval: 5 * time.Millisecond}})
		if p.maint == nil || p.cfg.Maintenance.Resolver == nil {
			t.Fatal("no reconciler")
		}
		c := client(t)
		if r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":7}`); r.status != http.StatusBadGateway {
			t.Fatalf("upstream hung up: %d %s", r.status, r.body)
		}
		var r reply
		eventually(t, "the reconciler to settle the record", func() bool {
			r = send(t, c, "POST", base+"/v1/charges", "k", `{"amount":7}`)
			return r.status != http.StatusConflict
		})
		if r.status != http.StatusCreated || string(r.body) != `{"id":"ch_r"}` || r.header.Get("Idempotent-Replayed") != "true" ||
			r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("after reconciliation: %d %v %s", r.status, r.header, r.body)
		}
		if n := up.calls.Load(); n != 1 {
			t.Errorf("upstream called %d times, want 1", n)
		}
		qs := api.questions()
		if len(qs) == 0 || qs[0].Key != "k" || qs[0].Route != "/v1/charges" || !strings.Contains(qs[0].LastError, "after the request was sent") {
			t.Errorf("questions: %+v", qs)
		}
	})
}

func TestParseProxyMaintenanceFlags(t *testing.T) {
	t.Parallel()
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://127.0.0.1:3000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Maintenance
	if cfg.NoMaintenance || m.SweepInterval != 15*time.Second || m.ReapInterval != time.Minute ||
		m.ReconcileInterval != 10*time.Second || m.SoftExpire || cfg.ResolveURL != "" || cfg.Cache != "" {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://127.0.0.1:3000", "--sweep-interval", "1s",
		"--reap-interval", "2s", "--reconcile-interval", "3s", "--soft-expire", "--resolve-url", "https://ops.internal/resolve",
		"--cache", "redis://127.0.0.1:6379/2?prefix=x:&max_ttl=1m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m = cfg.Maintenance
	if m.SweepInterval != time.Second || m.ReapInterval != 2*time.Second || m.ReconcileInterval != 3*time.Second ||
		!m.SoftExpire || cfg.ResolveURL != "https://ops.internal/resolve" || cfg.Cache == "" {
		t.Errorf("parsed %+v", cfg)
	}
	cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://x", "--maintenance=false"}, io.Discard)
	if err != nil || !cfg.NoMaintenance {
		t.Errorf("--maintenance=false: %+v %v", cfg, err)
	}
	for _, args := range [][]string{
		{"--sweep-interval", "0s"},
		{"--reap-interval", "-1s"},
		{"--reconcile-interval", "0s"},
		{"--maintenance=false", "--resolve-url", "http://ops/resolve"},
		{"--resolve-url", "ops/resolve"},
		{"--cache", "memcached://x"},
		{"--cache", "redis://x:6379/0?max_ttl=soon"},
		{"--cache", "redis://x:6379/0?bogus=1"},
	} {
		args = append([]string{"--upstream", "http://x"}, args...)
		var stderr strings.Builder
		if _, _, _, err := parseProxyFlags(args, &stderr); !errors.Is(err, ErrUsage) {
			t.Errorf("parseProxyFlags(%q) = %v, want ErrUsage", args, err)
		}
	}
}

// The proxy's --cache serves replays from Redis; idem delete --cache drops
// the entry with the record, while a delete that bypasses the cache leaves
// the cached replay answering (until its max_ttl).
func TestProxyCacheAndDelete(t *testing.T) {
	t.Parallel()
	prefix := fmt.Sprintf("idem:test:cli:%d:", time.Now().UnixNano())
	cacheURL := testenv.RedisURL(t) + "?prefix=" + prefix + "&max_ttl=1m"
	rdb := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t), DB: testenv.RedisDB(t)})
	t.Cleanup(func() {
		keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
		rdb.Close()
	})
	cached := func() int { // entries, not an invalidation's tombstones
		keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, k := range keys {
			if v, err := rdb.Get(context.Background(), k).Result(); err == nil && v != cache.Tombstone {
				n++
			}
		}
		return n
	}

	dsn := tempDSN(t)
	api := &chargeAPI{}
	up := newUpstream(t, api)
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: dsn, Cache: cacheURL})
	c := client(t)
	charge := func() reply { return send(t, c, "POST", base+"/v1/charges", "c1", `{"amount":1}`) }

	first := charge()
	if first.status != http.StatusCreated || cached() != 0 {
		t.Fatalf("first: %d, %d cache entries", first.status, cached())
	}
	if r := charge(); r.header.Get("Idempotent-Replayed") != "true" || cached() != 1 {
		t.Fatalf("replay: %d %v, %d cache entries", r.status, r.header, cached())
	}

	out, errOut, err := run("delete", "--store", dsn, "--cache", cacheURL, "--route", "/v1/charges", "c1")
	if err != nil || !strings.Contains(out, "deleted") || cached() != 0 {
		t.Fatalf("delete --cache: %q %v, %d cache entries\n%s", out, err, cached(), errOut)
	}
	second := charge()
	if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "" || api.calls.Load() != 2 {
		t.Fatalf("after delete --cache: %d %v, upstream calls %d; want a new execution", second.status, second.header, api.calls.Load())
	}

	// Once the delete's tombstone is gone (its max_ttl passed: dropped
	// here), fill the cache again, then delete behind its back.
	if keys, err := rdb.Keys(context.Background(), prefix+"*").Result(); err != nil || len(keys) != 1 {
		t.Fatalf("keys after delete --cache: %v %v, want the tombstone alone", keys, err)
	} else {
		rdb.Del(context.Background(), keys...)
	}
	charge()
	if cached() != 1 {
		t.Fatalf("%d cache entries", cached())
	}
	if _, _, err := run("delete", "--store", dsn, "--route", "/v1/charges", "c1"); err != nil {
		t.Fatal(err)
	}
	if r := charge(); r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(second.body) || api.calls.Load() != 2 {
		t.Errorf("the cache no longer answered after a delete that bypassed it: %d %s (calls %d)", r.status, r.body, api.calls.Load())
	}
}
