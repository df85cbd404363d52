package cli

import (
	"context"
	"net/http"
	"os"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracing is the binary's side of the engine's spans: an SDK
// TracerProvider exporting OTLP over HTTP when the standard variables name
// a collector, none otherwise.
type tracing struct {
	provider *sdktrace.TracerProvider // nil when spans go nowhere
}

// otlpVariables name the collector; the exporter reads them (and the other
// OTEL_EXPORTER_OTLP_* variables: headers, timeout, TLS) itself.
var otlpVariables = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}

func newTracing(ctx context.Context) (*tracing, error) {
	set := false
	for _, v := range otlpVariables {
		if os.Getenv(v) != "" {
			set = true
		}
	}
	if !set {
		return &tracing{}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "idem"))),
	)
	return &tracing{provider: tp}, nil
}

// tracerProvider is the provider to give the engine: a no-op one when
// spans go nowhere, so that none are built.
func (t *tracing) tracerProvider() trace.TracerProvider {
	if t.provider == nil {
		return noop.NewTracerProvider()
	}
	return t.provider
}

func (t *tracing) shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

var setPropagator sync.Once

// usePropagator makes W3C Trace Context the propagator of the process, the
// format upstreams and collectors speak.
func usePropagator() {
	setPropagator.Do(func() { otel.SetTextMapPropagator(propagation.TraceContext{}) })
}

// traced continues the caller's trace (its traceparent header) in a server
// span around the request, under which the engine's spans and the upstream
// call (which carries the span on, see rewrite) sit.
func traced(tracer trace.Tracer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, "idem.proxy", trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method)))
		defer span.End()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// injectTrace passes the request's span on to the upstream.
func injectTrace(out *http.Request) {
	otel.GetTextMapPropagator().Inject(out.Context(), propagation.HeaderCarrier(out.Header))
}
