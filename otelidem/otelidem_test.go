package otelidem_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/otelidem"
	"github.com/idem-go/idem/store/memory"
)

type telemetry struct {
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	obs    idem.Observer
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tel.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	var err error
	if tel.obs, err = otelidem.New(otelidem.Config{MeterProvider: mp, TracerProvider: tp}); err != nil {
		t.Fatal(err)
	}
	return tel
}

// sums returns the int64 counters by name and attribute set.
func (tel *telemetry) sums(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/idem-go/idem" {
			t.Fatalf("meter %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sums[m.Name+"{"+p.Attributes.Encoded(attribute.DefaultEncoder())+"}"] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					sums[m.Name+"{"+p.Attributes.Encoded(attribute.DefaultEncoder())+"}"] += int64(p.Count)
				}
			}
		}
	}
	return sums
}

func attr(kvs []attribute.KeyValue, k string) (attribute.Value, bool) {
	for _, kv := range kvs {
		if string(kv.Key) == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// A new key's request makes reserve and complete spans carrying the
// outcome and the fence; its retry makes a reserve span with the outcome
// replay and a replay span; the counters are the engine's.
func TestSpansAndMetrics(t *testing.T) {
	tel := newTelemetry(t)
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler), Observer: tel.obs})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
	})))
	send := func() {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != 201 {
			t.Fatalf("status %d", w.Code)
		}
	}

	send()
	spans := tel.spans.GetSpans()
	if len(spans) != 2 || spans[0].Name != "idem.reserve" || spans[1].Name != "idem.complete" {
		t.Fatalf("spans of a new key: %v", spans.Snapshots())
	}
	out, _ := attr(spans[0].Attributes, "idem.outcome")
	fence, ok := attr(spans[0].Attributes, "idem.fence")
	if out.AsString() != "created" || !ok || fence.AsInt64() == 0 {
		t.Fatalf("reserve span attributes %v", spans[0].Attributes)
	}
	if f, _ := attr(spans[1].Attributes, "idem.fence"); f.AsInt64() != fence.AsInt64() {
		t.Fatalf("complete span fence %v, want %d", spans[1].Attributes, fence.AsInt64())
	}
	for _, s := range spans {
		if st, _ := attr(s.Attributes, "idem.store"); st.AsString() != "memory" {
			t.Fatalf("span %s store %v", s.Name, s.Attributes)
		}
		if rt, _ := attr(s.Attributes, "http.route"); rt.AsString() != "/v1/charges" {
			t.Fatalf("span %s route %v", s.Name, s.Attributes)
		}
	}

	tel.spans.Reset()
	send()
	spans = tel.spans.GetSpans()
	if len(spans) != 2 || spans[0].Name != "idem.reserve" || spans[1].Name != "idem.replay" {
		t.Fatalf("spans of a replay: %v", spans.Snapshots())
	}
	if out, _ := attr(spans[0].Attributes, "idem.outcome"); out.AsString() != "replay" {
		t.Fatalf("reserve span of a replay: %v", spans[0].Attributes)
	}

	sums := tel.sums(t)
	for k, want := range map[string]int64{
		"idem.reserve.outcomes{outcome=created}": 1,
		"idem.reserve.outcomes{outcome=replay}":  1,
		"idem.store.duration{op=reserve}":        2,
		"idem.store.duration{op=complete}":       1,
	} {
		if sums[k] != want {
			t.Errorf("%s = %d, want %d (all: %v)", k, sums[k], want, sums)
		}
	}
}

// Failures: a failed store call counts under idem.store.errors and its
// step's span has the status Error; events count under idem.<name>.
func TestFailuresAndEvents(t *testing.T) {
	tel := newTelemetry(t)
	ctx := context.Background()
	tel.obs.StoreCall(ctx, "sweep", 0, true)
	tel.obs.StoreCall(ctx, "reserve", 0, false)
	tel.obs.FinishFailed(ctx, "complete")
	tel.obs.Event(ctx, "zombies_swept", 3)
	tel.obs.Event(ctx, "reconcile_dead", 1)
	tel.obs.Event(ctx, "reconcile_raced", 2)
	tel.obs.Event(ctx, "reservation_released", 1)
	_, end := tel.obs.Step(ctx, idem.Step{Name: idem.StepComplete, Store: "memory", Fence: 7})
	end(idem.StepEnd{Fence: 7, Attempts: 3, Err: idem.ErrStore})

	sums := tel.sums(t)
	for k, want := range map[string]int64{
		"idem.store.errors{op=sweep}":       1,
		"idem.store.errors{op=reserve}":     0,
		"idem.finish.failures{op=complete}": 1,
		"idem.zombies_swept{}":              3,
		"idem.reconcile_dead{}":             1,
		"idem.reconcile_raced{}":            2,
		"idem.reservation_released{}":       1,
	} {
		if sums[k] != want {
			t.Errorf("%s = %d, want %d (all: %v)", k, sums[k], want, sums)
		}
	}
	spans := tel.spans.GetSpans()
	if len(spans) != 1 || spans[0].Name != "idem.complete" || spans[0].Status.Code.String() != "Error" {
		t.Fatalf("span %v", spans.Snapshots())
	}
	if a, _ := attr(spans[0].Attributes, "idem.attempts"); a.AsInt64() != 3 {
		t.Fatalf("attempts %v", spans[0].Attributes)
	}
}

// With OpenTelemetry's no-op tracer provider the steps start no span: the
// context a step returns is the caller's, which still carries the caller's
// span context for whatever the step calls; metrics are recorded as ever.
func TestNoopTracerStartsNoSpan(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := otelidem.New(otelidem.Config{MeterProvider: mp, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	step := idem.Step{Name: idem.StepReserve, Store: "memory", Scope: "0:POST /x", Route: "/x"}
	for _, ctx := range []context.Context{
		context.Background(), trace.ContextWithRemoteSpanContext(context.Background(), parent),
	} {
		got, end := obs.Step(ctx, step)
		end(idem.StepEnd{Outcome: "created"})
		if got != ctx {
			t.Error("the step started a span under the no-op provider")
		}
		if sc, want := trace.SpanContextFromContext(got), trace.SpanContextFromContext(ctx); !sc.Equal(want) {
			t.Errorf("span context %v, want the caller's %v", sc, want)
		}
	}

	tel := &telemetry{reader: reader, obs: obs}
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	for range 2 {
		r := httptest.NewRequest("POST", "/x", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	sums := tel.sums(t)
	if sums["idem.reserve.outcomes{outcome=created}"] != 1 || sums["idem.reserve.outcomes{outcome=replay}"] != 1 {
		t.Errorf("counters %v", sums)
	}
}

// Per-tenant outcomes keep a bounded number of series: a tenant gets a
// series of its own only once it had a 2xx answer, up to MaxTenants; the
// others (junk tenants first among them) are counted under "other",
// however many call.
func TestTenantOutcomesAreBounded(t *testing.T) {
	tel := &telemetry{reader: sdkmetric.NewManualReader()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := otelidem.New(otelidem.Config{MeterProvider: mp, MaxTenants: 2})
	if err != nil {
		t.Fatal(err)
	}
	to, ok := obs.(idem.TenantObserver)
	if !ok {
		t.Fatal("the observer does not count per tenant")
	}
	ctx := context.Background()
	ts := obs.(idem.TenantSuccessObserver)
	// 100 junk tenants, none ever answered 2xx, come first: they take no
	// place.
	for i := range 100 {
		to.TenantReserve(ctx, fmt.Sprint("junk-", i), "created")
	}
	ts.TenantSucceeded(ctx, "acme")
	ts.TenantSucceeded(ctx, "globex")
	ts.TenantSucceeded(ctx, "initech") // no room left
	to.TenantReserve(ctx, "initech", "replay")
	to.TenantReserve(ctx, "acme", "replay")
	to.TenantReserve(ctx, "acme", "replay")
	to.TenantReserve(ctx, "globex", "in_progress")
	for i := range 1000 {
		to.TenantReserve(ctx, fmt.Sprint("sprayer-", i), "rate_limited")
	}
	to.TenantReserve(ctx, "acme", "key_reused")
	to.TenantReserve(ctx, "other", "replay") // a tenant named like the bucket joins it
	tenants := map[string]bool{}
	got := map[string]int64{}
	for k, v := range tel.sums(t) {
		if name, rest, ok := strings.Cut(k, "{"); ok && name == "idem.tenant.outcomes" {
			got[rest] = v
			attrs := strings.TrimSuffix(rest, "}")
			for _, kv := range strings.Split(attrs, ",") {
				if v, ok := strings.CutPrefix(kv, "tenant="); ok {
					tenants[v] = true
				}
			}
		}
	}
	want := map[string]int64{
		"outcome=replay,tenant=acme}":        2,
		"outcome=key_reused,tenant=acme}":    1,
		"outcome=in_progress,tenant=globex}": 1,
		"outcome=rate_limited,tenant=other}": 1000,
		"outcome=created,tenant=other}":      100,
		"outcome=replay,tenant=other}":       2,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("idem.tenant.outcomes{%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if len(tenants) != 3 {
		t.Fatalf("tenant attribute values %v, want acme, globex and other", tenants)
	}
}
