package cli

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The proxy continues the caller's trace: the upstream gets a traceparent
// of the same trace (whose parent is the proxy's span), and the proxy's
// spans, the engine's included, belong to that trace.
func TestProxyPropagatesTrace(t *testing.T) {
	t.Parallel()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const callerSpan = "00f067aa0ba902b7"
	got := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Traceparent")
		w.WriteHeader(201)
	}))
	t.Cleanup(up.Close)

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", TracerProvider: tp})

	r := send(t, client(t), "POST", base+"/v1/charges", "k1", `{"amount":1}`,
		"Traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	if r.status != 201 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	tpHeader := <-got
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.HeaderCarrier{"Traceparent": {tpHeader}}))
	if !sc.IsValid() {
		t.Fatalf("upstream traceparent %q", tpHeader)
	}
	if sc.TraceID().String() != traceID {
		t.Fatalf("upstream trace %s, want %s", sc.TraceID(), traceID)
	}
	if sc.SpanID().String() == callerSpan {
		t.Fatalf("upstream parent is the caller's span, not the proxy's")
	}

	// The server span ends once the handler returned, which may be just
	// after the client read the answer.
	var names map[string]bool
	for deadline := time.Now().Add(10 * time.Second); ; {
		names = map[string]bool{}
		for _, s := range spans.GetSpans() {
			if s.SpanContext.TraceID().String() != traceID {
				t.Fatalf("span %s in trace %s, want %s", s.Name, s.SpanContext.TraceID(), traceID)
			}
			names[s.Name] = true
			if s.Name == "idem.proxy" && s.SpanContext.SpanID() != sc.SpanID() {
				t.Fatalf("upstream parent %s is not the proxy span %s", sc.SpanID(), s.SpanContext.SpanID())
			}
		}
		if names["idem.proxy"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, n := range []string{"idem.proxy", "idem.reserve", "idem.complete"} {
		if !names[n] {
			t.Errorf("no span %s (have %v)", n, names)
		}
	}
}

// With the standard OTLP variable set, the proxy exports its spans to the
// collector it names; they are flushed when the proxy stops.
func TestProxyExportsOTLP(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" && len(body) > 0 {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(200)
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	t.Cleanup(up.Close)

	p, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: up.URL, Store: "memory:",
		SingleTenant: true, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if p.tracing.provider == nil {
		t.Fatal("no TracerProvider with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	if r := send(t, client(t), "POST", "http://"+p.Addr().String()+"/v1/charges", "k1", `{}`); r.status != 201 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if posts.Load() == 0 {
		t.Fatal("no spans reached the collector")
	}
}

// Without the variables the proxy builds no exporter.
func TestProxyWithoutOTLP(t *testing.T) {
	for _, v := range otlpVariables {
		t.Setenv(v, "")
	}
	tr, err := newTracing(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tr.provider != nil {
		t.Fatal("a TracerProvider without OTLP variables")
	}
}
