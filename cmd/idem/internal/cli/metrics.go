package cli

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// storeDurationBuckets are the bounds, in seconds, of idem.store.duration.
// The SDK's default bounds (0, 5, 10, 25, ... 10000) suit milliseconds and
// would put every store call in the first bucket.
var storeDurationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
}

// metrics is the binary's side of the engine's observability: the library
// records through the OpenTelemetry API only, so the binary installs an SDK
// MeterProvider whose reader is the Prometheus exporter, on a registry of
// its own (nothing registered globally, so two proxies in one process, as
// in tests, never collide).
type metrics struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

func newMetrics(log *slog.Logger) (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(exp),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "idem"))),
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Name: "idem.store.duration"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: storeDurationBuckets}},
		)),
	)
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// A scrape that fails part way still shows what could be gathered.
		ErrorHandling: promhttp.ContinueOnError,
	})
	return &metrics{provider: mp, handler: h}, nil
}

func (m *metrics) shutdown(ctx context.Context) error {
	return m.provider.Shutdown(ctx)
}
