package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/otelidem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// ProxyConfig configures a Proxy. Zero durations and sizes take the
// defaults of the proxy command's flags.
type ProxyConfig struct {
	// Listen is the address of the proxy. Defaults to 127.0.0.1:8080.
	Listen string
	// Upstream is the base URL of the API behind the proxy. Required.
	Upstream string
	// Store is the store DSN (see package storeurl). Defaults to
	// sqlite:idem.db.
	Store string
	// Migrate applies the store's pending migrations at start.
	Migrate bool
	// StoreConns sizes the server store's connection pool (see
	// storeurl.Options.Conns). Zero keeps the store's default.
	StoreConns int
	// StoreBatches is the number of group commits a PostgreSQL store may
	// have in flight (see storeurl.Options.Batches). Zero keeps the
	// store's default; -1 turns batching off.
	StoreBatches int
	// StoreClock replaces the store's clock (tests).
	StoreClock store.Clock

	// Profile, TTL, Lease, Wait, Methods and MaxBody set the engine's
	// Config fields of the same meaning; zero keeps the engine's default.
	Profile string
	TTL     time.Duration
	Lease   time.Duration
	Wait    time.Duration
	Methods []string
	MaxBody int64

	// KeyRequired, KeyReusedStatus, InProgressStatus, LeasePolicy,
	// MaxResponseBytes, StoreServerErrors, RetryAfter, StoreTimeout and
	// Fields set the engine's Config fields of the same name; zero keeps
	// the engine's default (the profile's for KeyRequired and
	// KeyReusedStatus).
	KeyRequired       *bool
	KeyReusedStatus   int
	InProgressStatus  int
	LeasePolicy       string
	MaxResponseBytes  int
	StoreServerErrors bool
	RetryAfter        time.Duration
	StoreTimeout      time.Duration
	Fields            []string

	// Routes are per-route settings, matched in ServeMux fashion; a
	// request no route matches takes the settings above.
	Routes []RouteConfig

	// KeyHeader names the header that carries the idempotency key
	// (idem.Config.KeyHeader); empty: Idempotency-Key. EchoKey sends the
	// key back on every answer to a keyed request (idem.Config.EchoKey).
	KeyHeader string
	EchoKey   bool

	// TenantRate limits each tenant to this many new keys a second
	// (idem.Config.TenantRate, a bucket of TenantBurst; per proxy);
	// TenantMaxActive caps the records a tenant holds in progress or
	// awaiting reconciliation (idem.Config.TenantMaxActive, across every
	// proxy sharing the store). Zero: off.
	TenantRate      float64
	TenantBurst     int
	TenantMaxActive int
	// NewKeyRate limits the proxy, whatever the tenant, to this many new
	// keys a second (idem.Config.NewKeyRate, a bucket of NewKeyBurst):
	// tenants minted for free do not escape it. Zero: off.
	NewKeyRate  float64
	NewKeyBurst int

	// BreakerFailures, BreakerOpen and BreakerMaxOpen tune the store's
	// circuit breaker (idem.Config fields of the same names); zero keeps
	// the engine's default, a negative BreakerFailures turns it off.
	BreakerFailures int
	BreakerOpen     time.Duration
	BreakerMaxOpen  time.Duration

	// TenantFrom lists the tenant sources, tried in order (see
	// tenantSourcesHelp): "authorization", "header:NAME", "cookie:NAME",
	// "trusted-header:NAME"; an entry may be a comma list. NewProxy fails
	// without a source unless SingleTenant is set, so two callers never
	// share records by accident.
	TenantFrom []string
	// TenantHeader is the deprecated spelling of TenantFrom
	// "trusted-header:NAME", tried after the TenantFrom sources.
	TenantHeader string
	// SingleTenant declares one trusted caller: every request is the
	// tenant "" and no source is read.
	SingleTenant bool
	// TenantSecret keys the hash (HMAC-SHA-256) of the credential sources,
	// so a leaked store or log does not let anyone test guessed
	// credentials. Nil: a SQLite file store keeps a generated one next to
	// the database (DB.tenant-secret), the memory store makes one per
	// process, and the shared stores refuse to start.
	TenantSecret []byte
	// FingerprintSecret keys the engine's request fingerprints
	// (idem.Config.Secret). Nil: plain SHA-256.
	FingerprintSecret []byte

	// MaxHeaderBytes bounds the request line and headers (431 above it).
	// Defaults to 64 KiB.
	MaxHeaderBytes int
	// BodyTimeout bounds the time to receive a request body; a client that
	// stalls is cut off and its connection closed. Defaults to 30s;
	// negative means no limit.
	BodyTimeout time.Duration
	// MaxBufferedBytes bounds the request bodies held in memory at once
	// by keyed requests (each counts its Content-Length, or MaxBody when
	// unknown, up to MaxBody). A request over the bound is answered 503
	// with Retry-After at once. Defaults to 64 MiB; it must be at least
	// MaxBody.
	MaxBufferedBytes int64

	// UpstreamTimeout bounds the wait for the upstream's response headers
	// once the request was sent. Defaults to 60s; negative means no limit.
	UpstreamTimeout time.Duration
	// ShutdownTimeout bounds the graceful shutdown: in-flight requests
	// get this long to finish. Defaults to 20s.
	ShutdownTimeout time.Duration

	// Admin is the address of the admin server (health, readiness and
	// AdminHandlers). Empty: no admin server.
	Admin string
	// AdminHandlers are mounted on the admin server beside /healthz and
	// /readyz, keyed by ServeMux pattern.
	AdminHandlers map[string]http.Handler
	// MeterProvider receives the engine's metrics. Nil with an admin
	// server: the proxy installs an OpenTelemetry SDK provider and serves
	// its metrics in the Prometheus format at /metrics on the admin
	// server (unless AdminHandlers has "/metrics").
	MeterProvider metric.MeterProvider
	// Webhook turns on the settlement webhook on the admin server
	// (WebhookPath); off without secrets.
	Webhook WebhookConfig
	// Console serves the operations console at /console/ on the admin
	// server, authenticated by ConsoleCredentials (required unless Admin is
	// a loopback address).
	Console            bool
	ConsoleCredentials console.Credentials
	// TracerProvider receives the engine's spans and the proxy's own
	// (idem.proxy, the server span of each request). Nil: an OpenTelemetry
	// SDK provider exporting OTLP over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT
	// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, no spans otherwise.
	// Either way the proxy continues the caller's trace (W3C traceparent)
	// and passes it on to the upstream.
	TracerProvider trace.TracerProvider

	// NoMaintenance turns off the background services the proxy runs
	// while it serves (sweeper, reaper, and the reconciler when there is a
	// resolver). Another instance, or scheduled idem sweep / reap /
	// reconcile run, must then do their work.
	NoMaintenance bool
	// Maintenance configures the background services; zero fields take
	// the defaults of maintenance.Config. TTL, Logger and Observer
	// default to the proxy's.
	Maintenance maintenance.Config
	// ResolveURL, when set and Maintenance.Resolver is nil, is the
	// upstream operators' endpoint the reconciler asks about unknown
	// outcomes (resolveProtocol).
	ResolveURL string

	// Cache, when set, is a Redis URL: replays are served from a cache in
	// front of the store (package store/cache).
	Cache string

	// Logger receives the proxy's and the engine's events. Defaults to a
	// text logger on stderr.
	Logger *slog.Logger

	// Async lists the asynchronous routes, as http.ServeMux patterns
	// with a method ("POST /v1/reports"): a keyed request on one is
	// recorded and answered 202 at once, and the proxy's worker forwards
	// it to the upstream (see idem.Config.Async). Defaults to none. A
	// route of Routes with Async is one more; a pattern in both is one
	// route, with the settings of Routes.
	Async []string
	// AsyncWait bounds how long an accepted request waits for a worker
	// before it ends with 408 (idem.Config.AsyncWait). Zero: 1h, or TTL
	// when shorter.
	AsyncWait time.Duration
	// AsyncKeepHeaders names sensitive headers (Authorization, Cookie)
	// kept with an asynchronous request for the upstream
	// (idem.Config.AsyncKeepHeaders).
	AsyncKeepHeaders []string
	// AsyncWorkers is how many asynchronous requests this proxy forwards
	// at once. Zero: this proxy runs no worker and only accepts requests
	// (other proxies on the store forward them).
	AsyncWorkers int
	// AsyncPoll is how long an idle worker waits before it looks for new
	// requests again. Zero: idem.DefaultWorkerPoll.
	AsyncPoll time.Duration

	// RequireSynchronousReplication refuses protected requests (503
	// store-not-durable) while the store's durability check says answers
	// it acknowledged could be lost by a failover or a restart
	// (idem.Config.RequireDurable): PostgreSQL standbys that commits do
	// not wait for, Redis without the append-only file or with replicas
	// that writes do not wait for, MySQL replicas without
	// semi-synchronous replication. Only with a PostgreSQL, MySQL or
	// Redis store.
	RequireSynchronousReplication bool
	// DurabilityInterval is how often the store's durability is checked
	// again (idem.Config.DurabilityInterval). Zero: 1m.
	DurabilityInterval time.Duration
}

// Proxy is the idempotency reverse proxy: the engine's middleware in front
// of an httputil.ReverseProxy to the upstream, behind a guard that names
// the caller's tenant and bounds what a client may make the proxy hold.
type Proxy struct {
	cfg       ProxyConfig
	log       *slog.Logger
	dsn       storeurl.DSN
	upstream  *url.URL
	transport *http.Transport
	rp        http.Handler // the reverse proxy alone
	handler   http.Handler // the guard in front of everything
	metrics   *metrics     // nil when the caller brought its own provider
	refusals  metric.Int64Counter
	// durabilityGauges observes the store's durability for the metrics.
	durabilityGauges metric.Registration
	tracing          *tracing      // nil when the caller brought its own provider
	spansOff         bool          // no span is recorded: the proxy neither starts nor injects one
	obs              idem.Observer // the engine's and the services' metrics and spans
	tenants          *tenants
	protected        map[string]bool
	routes           *routeTable // nil without Routes
	buffers          *semaphore.Weighted
	buffered         atomic.Int64 // bytes held under buffers, for tests

	async *asyncRoutes // nil without asynchronous routes

	// mu guards what attach sets once the store opened; guarded is nil
	// until then and protected requests are answered 503.
	mu          sync.Mutex
	store       store.Store
	engine      *idem.Engine
	asyncEngine *idem.Engine            // nil without asynchronous routes
	worker      *idem.Worker            // nil without asynchronous routes
	maint       *maintenance.Maintainer // nil with NoMaintenance
	guarded     atomic.Pointer[guarded]
	openErr     error                  // why the store is not open yet
	opening     chan struct{}          // closed when the background opener returns; nil without one
	readyReason atomic.Pointer[string] // last readiness failure seen ("" when ready), to log each change once

	ln       net.Listener
	server   *http.Server
	adminLn  net.Listener
	admin    *http.Server
	draining atomic.Bool
}

// guarded is what serves the requests the guard lets through once the
// store is open: the engine's middleware in front of the reverse proxy,
// and that of each route's own engine (nil for unprotected routes).
type guarded struct {
	main   http.Handler
	async  http.Handler // of the --async patterns no route repeats; nil without them
	routes []http.Handler
}

// Defaults of the proxy's resource limits.
const (
	defaultMaxHeaderBytes   = 64 << 10
	defaultBodyTimeout      = 30 * time.Second
	defaultMaxBufferedBytes = 64 << 20
)

// NewProxy binds the listeners and opens the store; Serve starts serving.
// Binding here lets a caller read Addr before serving, and a port conflict
// fail before anything runs. A store that cannot be opened does not fail
// NewProxy: Serve keeps trying in the background, with backoff, while the
// proxy answers protected requests 503 and /readyz reports not ready.
func NewProxy(ctx context.Context, cfg ProxyConfig) (_ *Proxy, err error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8080"
	}
	if cfg.Store == "" {
		cfg.Store = storeurl.Default
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = 60 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 20 * time.Second
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = defaultMaxHeaderBytes
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = defaultBodyTimeout
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = idem.DefaultMaxBodyBytes
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = idem.DefaultRetryAfter
	}
	if cfg.KeyHeader == "" {
		cfg.KeyHeader = idem.DefaultKeyHeader
	}
	if !store.ValidHeader(cfg.KeyHeader, nil) {
		return nil, configErr("proxy: --key-header %q is not a valid header name", cfg.KeyHeader)
	}
	// The guard looks the key up by the engine's (canonical) spelling.
	cfg.KeyHeader = textproto.CanonicalMIMEHeaderKey(cfg.KeyHeader)
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = defaultMaxBufferedBytes
	}
	if cfg.MaxBufferedBytes < cfg.MaxBody {
		return nil, configErr("proxy: --max-buffered-bytes (%d) is smaller than --max-body (%d): no body would fit", cfg.MaxBufferedBytes, cfg.MaxBody)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	up, err := parseUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	dsn, err := storeurl.Parse(cfg.Store)
	if err != nil {
		return nil, err
	}
	if cfg.StoreConns < 0 {
		// The store would never open: refused at start, not retried.
		return nil, fmt.Errorf("%w: --store-conns %d: want 0 (the store's default) or a positive pool size", ErrUsage, cfg.StoreConns)
	}
	if dsn.Kind == storeurl.Redis && cfg.TenantMaxActive > 0 {
		// Known before the store is reached: refused at once rather than
		// when it opens.
		return nil, fmt.Errorf("%w: --tenant-max-active needs a store that counts a tenant's records (SQLite, PostgreSQL, MySQL or memory), not Redis", ErrUsage)
	}
	if cfg.RequireSynchronousReplication && dsn.Kind != storeurl.Postgres && dsn.Kind != storeurl.MySQL && dsn.Kind != storeurl.Redis {
		return nil, fmt.Errorf("%w: --require-synchronous-replication needs a store that checks its replication (PostgreSQL, MySQL or Redis), not %s", ErrUsage, dsn.Kind)
	}
	tn, err := proxyTenants(cfg, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if cfg.TenantHeader != "" {
		cfg.Logger.Warn("idem proxy: --tenant-header is deprecated; use --tenant-from trusted-header:NAME", "name", cfg.TenantHeader)
	}

	if err := checkWebhook(cfg.Webhook, cfg.Admin); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if cfg.NoMaintenance && cfg.ResolveURL != "" {
		return nil, configErr("proxy: --resolve-url needs the background services (drop --maintenance=false)")
	}
	if cfg.ResolveURL != "" && cfg.Maintenance.Resolver == nil {
		r, err := newHTTPResolver(cfg.ResolveURL)
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		r.maxBody = cfg.maxResponseBytes()
		cfg.Maintenance.Resolver = r
	}

	p := &Proxy{cfg: cfg, log: cfg.Logger, upstream: up, dsn: dsn, tenants: tn,
		buffers: semaphore.NewWeighted(cfg.MaxBufferedBytes)}
	// Undo what was set up if a later step fails.
	defer func() {
		if err != nil {
			p.closeAll()
		}
	}()
	if cfg.MeterProvider == nil && cfg.Admin != "" && !mountsMetrics(cfg.AdminHandlers) {
		if p.metrics, err = newMetrics(cfg.Logger); err != nil {
			return nil, fmt.Errorf("proxy: metrics: %w", err)
		}
		cfg.MeterProvider = p.metrics.provider
		handlers := map[string]http.Handler{"/metrics": p.metrics.handler}
		for pattern, h := range cfg.AdminHandlers {
			handlers[pattern] = h
		}
		cfg.AdminHandlers = handlers
		p.cfg = cfg
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if p.refusals, err = mp.Meter("github.com/idem-go/idem/cmd/idem/internal/cli").Int64Counter("idem.proxy.refused",
		metric.WithDescription("requests the proxy refused before the engine, by reason")); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	if p.durabilityGauges, err = p.durabilityMetrics(mp.Meter("github.com/idem-go/idem/cmd/idem/internal/cli")); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	tp := cfg.TracerProvider
	if tp == nil {
		if p.tracing, err = newTracing(ctx); err != nil {
			return nil, fmt.Errorf("proxy: traces: %w", err)
		}
		tp = p.tracing.tracerProvider()
	}
	usePropagator()
	if p.obs, err = otelidem.New(otelidem.Config{MeterProvider: mp, TracerProvider: tp}); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	// The engine's settings are checked now, whether or not the store
	// answers: a typo must fail at start, not when the database comes up.
	if p.routes, err = cfg.checkSettings(); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if !cfg.NoMaintenance {
		if _, err := maintenance.New(memory.New(memory.Config{}), cfg.Maintenance); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
	}
	p.protected = map[string]bool{}
	for _, m := range cfg.Methods {
		p.protected[strings.ToUpper(m)] = true
	}
	if len(p.protected) == 0 {
		p.protected = map[string]bool{http.MethodPost: true, http.MethodPatch: true}
	}
	if p.async, err = newAsyncRoutes(cfg.Async, p.protected, p.routes); err != nil {
		return nil, err
	}
	if p.async != nil {
		if cfg.AsyncWorkers < 0 || cfg.AsyncPoll < 0 {
			return nil, configErr("proxy: --async-workers and --async-poll must not be negative")
		}
	}
	p.transport = newTransport(cfg.UpstreamTimeout)
	p.rp = &httputil.ReverseProxy{
		Rewrite:      p.rewrite,
		Transport:    p.transport,
		ErrorHandler: p.upstreamError,
		ErrorLog:     slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		BufferPool:   copyBuffers{},
	}
	// Without spans (no provider given, no collector configured) the
	// server span would record nothing, and the caller's traceparent
	// reaches the upstream as the reverse proxy copies every end-to-end
	// header: neither the span nor the propagation is worth a request copy.
	p.spansOff = cfg.TracerProvider == nil && p.tracing.provider == nil
	p.handler = http.HandlerFunc(p.guard)
	if !p.spansOff {
		p.handler = traced(tp.Tracer("github.com/idem-go/idem/cmd/idem/internal/cli"), p.handler)
	}

	if s, err := p.openStore(ctx); err == nil {
		if err := p.attach(s); err != nil {
			s.Close()
			return nil, err
		}
	} else {
		p.openErr = err
		p.log.Warn("idem proxy: the store is unavailable; protected requests get 503 while it is retried in the background",
			"store", string(dsn.Kind), "err", err)
	}

	if p.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	// Slow clients are bounded while sending headers here, while sending
	// a body by BodyTimeout (see guard), and while idle between requests;
	// upstream calls by UpstreamTimeout.
	p.server = cfg.limitedServer(p.handler)
	if cfg.AdminHandlers, err = p.mountWebhook(cfg.AdminHandlers); err != nil {
		return nil, err
	}
	if cfg.Admin != "" && cfg.Console {
		if err := p.mountConsole(&cfg); err != nil {
			return nil, err
		}
		p.cfg = cfg
	}
	if cfg.Admin != "" {
		if p.adminLn, err = net.Listen("tcp", cfg.Admin); err != nil {
			return nil, fmt.Errorf("proxy: admin listen: %w", err)
		}
		p.admin = cfg.limitedServer(adminLimits(AdminMux(p.ready, cfg.AdminHandlers), cfg.BodyTimeout))
	}
	p.log.Info("idem proxy listening", "listen", p.ln.Addr().String(), "upstream", up.Redacted(),
		"store", string(dsn.Kind), "cache", cfg.Cache != "", "admin", adminString(p.adminLn),
		"tenant_from", tn.String(), "maintenance", !cfg.NoMaintenance,
		"reconciler", !cfg.NoMaintenance && cfg.Maintenance.Resolver != nil)
	return p, nil
}

// proxyTenants builds the tenant rule of the proxy's configuration.
func proxyTenants(cfg ProxyConfig, log *slog.Logger) (*tenants, error) {
	specs := cfg.TenantFrom
	if cfg.TenantHeader != "" {
		specs = append(slices.Clip(specs), srcTrusted+":"+cfg.TenantHeader)
	}
	sources, err := parseTenantSources(specs)
	if err != nil {
		return nil, configErr("proxy: %w", err)
	}
	switch {
	case cfg.SingleTenant && len(sources) > 0:
		return nil, configErr("proxy: --single-tenant and --tenant-from exclude each other")
	case cfg.SingleTenant:
		return &tenants{single: true}, nil
	case len(sources) == 0:
		return nil, configErr("proxy: no tenant source: callers would share each other's records. " +
			"Name how callers are told apart with --tenant-from (authorization, header:NAME, cookie:NAME " +
			"or trusted-header:NAME, e.g. --tenant-from authorization), or declare one trusted caller with --single-tenant")
	}
	t := &tenants{sources: sources, secret: cfg.TenantSecret}
	if t.needsSecret() && len(t.secret) == 0 {
		secret, path, err := defaultTenantSecret(cfg.Store)
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		if path != "" {
			log.Info("idem proxy: tenant secret from the file beside the database", "path", path)
			if secretReadableByOthers(path) {
				log.Warn("idem proxy: the tenant secret file is readable by other users: chmod 600 it", "path", path)
			}
		}
		t.secret = secret
	}
	if t.mixed() {
		log.Warn("idem proxy: a trusted tenant header is a source beside credentials: a request without a credential is filed under the header's value, "+
			"so the gateway in front must strip that header from what clients send (trusted values that look like a credential's tenant id are refused)",
			"tenant_from", t.String())
	}
	return t, nil
}

// engineConfig is the engine's configuration; the tenant is the one the
// guard put in the request's context.
func (p *Proxy) engineConfig() idem.Config { return p.cfg.engineConfig(p.obs) }

// checkSettings checks the engine's settings, the proxy's and each
// route's, whether or not the store answers: a typo must fail at start,
// not when the database comes up. It returns the routes' table.
func (cfg ProxyConfig) checkSettings() (*routeTable, error) {
	routes, err := newRouteTable(cfg.Routes, cfg.Async)
	if err != nil {
		return nil, err
	}
	// The memory store has no durability check; the real store's is
	// required when it opens.
	cfg.RequireSynchronousReplication = false
	s := memory.New(memory.Config{})
	e, err := idem.New(s, cfg.engineConfig(nil))
	if err != nil {
		return nil, err
	}
	var ae *idem.Engine
	if len(cfg.Async) > 0 || routes.hasAsync() {
		if ae, err = idem.New(s, cfg.asyncEngineConfig(nil)); err != nil {
			return nil, err
		}
	}
	if _, err := routes.routeEngines(e, ae); err != nil {
		return nil, err
	}
	return routes, nil
}

// maxResponseBytes is the engine's MaxResponseBytes, its default applied:
// the bound on a body kept for replays, also of answers settled by the
// reconciler and the webhook.
func (cfg ProxyConfig) maxResponseBytes() int {
	if cfg.MaxResponseBytes > 0 {
		return cfg.MaxResponseBytes
	}
	return idem.DefaultMaxResponseBytes
}

// engineConfig is the engine's configuration of cfg, reporting to obs.
func (cfg ProxyConfig) engineConfig(obs idem.Observer) idem.Config {
	return idem.Config{
		Profile:           idem.Profile(cfg.Profile),
		Methods:           cfg.Methods,
		KeyRequired:       cfg.KeyRequired,
		KeyReusedStatus:   cfg.KeyReusedStatus,
		InProgressStatus:  cfg.InProgressStatus,
		TTL:               cfg.TTL,
		Lease:             cfg.Lease,
		LeasePolicy:       store.LeasePolicy(cfg.LeasePolicy),
		Wait:              cfg.Wait,
		MaxBodyBytes:      cfg.MaxBody,
		MaxResponseBytes:  cfg.MaxResponseBytes,
		StoreServerErrors: cfg.StoreServerErrors,
		RetryAfter:        cfg.RetryAfter,
		StoreTimeout:      cfg.StoreTimeout,
		Fields:            cfg.Fields,
		KeyHeader:         cfg.KeyHeader,
		EchoKey:           cfg.EchoKey,
		Secret:            cfg.FingerprintSecret,
		Tenant:            tenantFromContext,
		Route:             proxyRoute,
		Logger:            cfg.Logger,
		Observer:          obs,

		TenantRate:         cfg.TenantRate,
		TenantBurst:        cfg.TenantBurst,
		TenantMaxActive:    cfg.TenantMaxActive,
		NewKeyRate:         cfg.NewKeyRate,
		NewKeyBurst:        cfg.NewKeyBurst,
		BreakerFailures:    cfg.BreakerFailures,
		BreakerOpen:        cfg.BreakerOpen,
		BreakerMaxOpen:     cfg.BreakerMaxOpen,
		RequireDurable:     cfg.RequireSynchronousReplication,
		DurabilityInterval: cfg.DurabilityInterval,
	}
}

// openStore opens the store once.
func (p *Proxy) openStore(ctx context.Context) (store.Store, error) {
	return storeurl.Open(ctx, p.cfg.Store, storeurl.Options{
		Migrate: p.cfg.Migrate, Clock: p.cfg.StoreClock, Cache: p.cfg.Cache, Logger: p.cfg.Logger,
		Conns: p.cfg.StoreConns, Batches: p.cfg.StoreBatches,
	})
}

// attach puts the opened store behind the guard: the engine, its
// middleware and the background services.
func (p *Proxy) attach(s store.Store) error {
	e, err := idem.New(s, p.engineConfig())
	if err != nil {
		return err
	}
	ae, w, err := p.attachAsync(e)
	if err != nil {
		return err
	}
	engines, err := p.routes.routeEngines(e, ae)
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.store, p.engine, p.openErr = s, e, nil
	if !p.cfg.NoMaintenance {
		if p.maint, err = maintenance.New(s, p.maintenanceConfig()); err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
	}
	p.asyncEngine, p.worker = ae, w
	g := &guarded{main: e.Middleware(p.rp), routes: make([]http.Handler, len(engines))}
	if ae != nil {
		g.async = ae.Middleware(p.rp)
	}
	for i, re := range engines {
		if re != nil {
			g.routes[i] = re.Middleware(p.rp)
		}
	}
	p.guarded.Store(g)
	return nil
}

// Backoff of the background opener.
const (
	openRetryMin = 100 * time.Millisecond
	openRetryMax = 5 * time.Second
	openTimeout  = 10 * time.Second
)

// openLoop opens the store in the background until it opens or ctx ends,
// then starts the background services under serveCtx. It logs the success
// once (NewProxy logged the first failure); every attempt in between at
// debug level.
func (p *Proxy) openLoop(ctx, serveCtx context.Context) {
	defer close(p.opening)
	wait := openRetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, openRetryMax)
		octx, cancel := context.WithTimeout(ctx, openTimeout)
		s, err := p.openStore(octx)
		cancel()
		if err != nil {
			p.mu.Lock()
			p.openErr = err
			p.mu.Unlock()
			p.log.Debug("idem proxy: the store is still unavailable", "err", err)
			continue
		}
		if ctx.Err() != nil {
			s.Close()
			return
		}
		if err := p.attach(s); err != nil {
			s.Close()
			p.log.Error("idem proxy: the engine refused the store", "err", err)
			return
		}
		p.log.Info("idem proxy: the store is available; protected requests are served", "store", string(p.dsn.Kind))
		if err := p.startMaintenance(serveCtx); err != nil {
			p.log.Error("idem proxy: background services did not start", "err", err)
		}
		if err := p.startWorker(serveCtx); err != nil {
			p.log.Error("idem proxy: the asynchronous worker did not start", "err", err)
		}
		return
	}
}

func (p *Proxy) startMaintenance(ctx context.Context) error {
	p.mu.Lock()
	m := p.maint
	p.mu.Unlock()
	if m == nil {
		return nil
	}
	return m.Start(ctx)
}

// mountsMetrics reports whether the caller brought its own /metrics.
func mountsMetrics(handlers map[string]http.Handler) bool {
	for pattern := range handlers {
		if _, path, _ := strings.Cut(pattern, " "); pattern == "/metrics" || path == "/metrics" {
			return true
		}
	}
	return false
}

func adminString(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

func parseUpstream(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("proxy: an upstream URL is required (--upstream http://host:port)")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("proxy: --upstream %q: want an http:// or https:// URL with a host", raw)
	}
	return u, nil
}

// Addr returns the proxy's bound address.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// AdminAddr returns the admin server's bound address, or nil without one.
func (p *Proxy) AdminAddr() net.Addr {
	if p.adminLn == nil {
		return nil
	}
	return p.adminLn.Addr()
}

// Store returns the proxy's store, nil while it is not open yet; Serve
// closes it on return.
func (p *Proxy) Store() store.Store {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.store
}

// Handler returns the proxy's handler (guard, engine middleware and
// reverse proxy).
func (p *Proxy) Handler() http.Handler { return p.handler }

// Serve serves, and runs the background services, until ctx is cancelled
// or a server fails, then shuts down gracefully: readiness turns 503,
// in-flight requests get ShutdownTimeout to finish, the background
// services stop, and the store is closed last, so every request that ran
// could record its outcome. It returns nil after a clean shutdown.
func (p *Proxy) Serve(ctx context.Context) error {
	stopOpening := func() {}
	if p.Store() != nil {
		if err := p.startMaintenance(ctx); err != nil {
			return err
		}
		if err := p.startWorker(ctx); err != nil {
			return err
		}
	} else {
		var octx context.Context
		octx, stopOpening = context.WithCancel(ctx)
		p.opening = make(chan struct{})
		go p.openLoop(octx, ctx)
	}
	defer stopOpening()
	errc := make(chan error, 2)
	running := 1
	go func() { errc <- p.server.Serve(p.ln) }()
	if p.admin != nil {
		running++
		go func() { errc <- p.admin.Serve(p.adminLn) }()
	}
	var failed error
	select {
	case <-ctx.Done():
		p.log.Info("idem proxy shutting down", "timeout", p.cfg.ShutdownTimeout.String())
	case failed = <-errc:
		running--
		p.log.Error("idem proxy server failed", "err", failed)
	}
	p.draining.Store(true)

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.ShutdownTimeout)
	defer cancel()
	var errs []error
	if err := p.server.Shutdown(sctx); err != nil {
		// Past the deadline the clients are cut off and the store closes
		// under the requests still running: as after a crash, their keys
		// stay in progress until the lease expires, then become unknown.
		errs = append(errs, fmt.Errorf("proxy: shutdown: %w", err), p.server.Close())
	}
	if p.admin != nil {
		if err := p.admin.Shutdown(sctx); err != nil {
			errs = append(errs, p.admin.Close())
		}
	}
	for ; running > 0; running-- {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if p.opening != nil {
		// The opener must not attach a store after the close below.
		stopOpening()
		<-p.opening
	}
	p.transport.CloseIdleConnections()
	if err := p.stopWorker(sctx); err != nil {
		errs = append(errs, fmt.Errorf("proxy: asynchronous worker: %w", err))
	}
	p.mu.Lock()
	maint, st := p.maint, p.store
	p.mu.Unlock()
	if maint != nil {
		if err := maint.Stop(sctx); err != nil {
			errs = append(errs, fmt.Errorf("proxy: background services: %w", err))
		}
	}
	if p.durabilityGauges != nil {
		p.durabilityGauges.Unregister()
	}
	if p.metrics != nil {
		if err := p.metrics.shutdown(sctx); err != nil {
			errs = append(errs, fmt.Errorf("proxy: metrics: %w", err))
		}
	}
	if err := p.tracing.shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("proxy: traces: %w", err))
	}
	if st != nil {
		if err := st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("proxy: close store: %w", err))
		}
	}
	if failed != nil && !errors.Is(failed, http.ErrServerClosed) {
		errs = append(errs, failed)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	p.log.Info("idem proxy stopped")
	return nil
}

// closeAll releases what NewProxy acquired when it fails part way.
func (p *Proxy) closeAll() {
	if p.ln != nil {
		p.ln.Close()
	}
	if p.adminLn != nil {
		p.adminLn.Close()
	}
	if p.store != nil {
		p.store.Close()
	}
	if p.metrics != nil {
		p.metrics.shutdown(context.Background())
	}
	p.tracing.shutdown(context.Background())
}

// ready is the readiness check: not while draining, and only when the
// store is open and the engine would serve (idem.Engine.Ready: the
// circuit breaker closed, a real read of the store answered). Each change
// of readiness, and of its reason, is logged once with the detail that
// /readyz does not show.
func (p *Proxy) ready(ctx context.Context) error {
	if p.draining.Load() {
		return &idem.NotReady{Reason: idem.ReasonShuttingDown}
	}
	p.mu.Lock()
	e, openErr := p.engine, p.openErr
	p.mu.Unlock()
	var err error
	if e == nil {
		err = &idem.NotReady{Reason: idem.ReasonStoreNotOpen, Err: openErr}
	} else {
		err = e.Ready(ctx)
	}
	reason := ""
	if err != nil {
		reason = idem.PublicReason(err)
	}
	if prev := p.readyReason.Swap(&reason); prev == nil || *prev != reason {
		switch {
		case err == nil && prev != nil:
			p.log.Info("idem proxy: ready again; the store answers")
		case err != nil && e != nil:
			p.log.Warn("idem proxy: not ready; protected requests may get 503", "reason", reason, "err", err)
		}
	}
	return err
}

// newTransport tunes the upstream transport for a proxy: Go's default keeps
// 2 idle connections per host, which makes a busy proxy dial for most
// requests.
func newTransport(responseTimeout time.Duration) *http.Transport {
	if responseTimeout < 0 {
		responseTimeout = 0
	}
	return &http.Transport{
		// No Proxy: the upstream is addressed directly, whatever
		// HTTP_PROXY says in the proxy's environment.
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: responseTimeout,
		ForceAttemptHTTP2:     true,
	}
}

// copyBuffers lends the reverse proxy the buffers it copies response
// bodies through, instead of a new 32 KiB buffer per request.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (copyBuffers) Get() []byte { return copyBufferPool.Get().(*[32 << 10]byte)[:] }
func (copyBuffers) Put(b []byte) {
	if cap(b) == 32<<10 {
		copyBufferPool.Put((*[32 << 10]byte)(b[:32<<10]))
	}
}

// sentKey marks, in an outgoing request's context, whether the transport
// wrote the request: the line between "never sent" and "maybe executed".
type sentKey struct{}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.upstream)
	pr.SetXForwarded()
	if !p.spansOff {
		injectTrace(pr.Out)
	}
	if idem.FromContext(pr.In.Context()) == nil {
		return // not under a key: an ordinary reverse proxy request
	}
	// A client that gives up must not cut the upstream call short: the
	// call runs to its end so the outcome is recorded and the client's
	// retry gets a replay instead of an unknown outcome.
	ctx := context.WithoutCancel(pr.Out.Context())
	sent := new(atomic.Bool)
	ctx = context.WithValue(ctx, sentKey{}, sent)
	// WroteRequest fires once the request is handed to the connection,
	// also when the write failed part way: from then on the upstream may
	// have acted on it, so every later failure is an unknown outcome.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { sent.Store(true) },
	})
	pr.Out = pr.Out.WithContext(ctx)
	hideKeyFromTransport(pr.Out.Header)
}

// hideKeyFromTransport stops net/http's Transport from silently sending
// the request a second time. The Transport treats a request carrying an
// Idempotency-Key (and no body to rewind) as replayable and re-sends it when
// a reused connection fails after the write: exactly the case where the
// upstream may already have executed it. Field names are case-insensitive
// on the wire, so spelling the names in lower case keeps them for the
// upstream while the Transport, which looks them up in canonical form, no
// longer sees them.
func hideKeyFromTransport(h http.Header) {
	for _, name := range [...]string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := h[name]; ok {
			delete(h, name)
			h[strings.ToLower(name)] = v
		}
	}
}

// upstreamError answers a request the upstream did not answer. The 502 is a
// 5xx, so under the response policy the engine releases the key (a retry
// runs again) unless the request may have reached the upstream: then the
// record becomes unknown and the upstream is never called again for it.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := idem.FromContext(r.Context())
	sent, _ := r.Context().Value(sentKey{}).(*atomic.Bool)
	prob, detail := proxyProblem{status: http.StatusBadGateway, title: "Bad Gateway"}, ""
	switch {
	case x != nil && sent != nil && sent.Load():
		prob = probUpstreamFailed
		x.Uncertain("upstream failed after the request was sent: " + err.Error())
		p.log.Warn("idem proxy: upstream failed after the request was sent; outcome unknown",
			"method", r.Method, "path", r.URL.Path, "key", x.Key(), "fence", x.Fence(), "err", err)
		detail = "The upstream failed after the request was sent; its outcome is unknown, so it will not be executed again until it is reconciled."
	case x != nil:
		prob = probUpstreamUnreachable
		p.log.Warn("idem proxy: upstream unreachable; the key is released for a retry",
			"method", r.Method, "path", r.URL.Path, "key", x.Key(), "err", err)
		detail = "The request could not be sent to the upstream and was not executed; it can be retried."
	default:
		p.log.Warn("idem proxy: upstream request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		detail = "The upstream did not answer."
	}
	writeProxyProblem(w, idem.Profile(p.cfg.Profile), p.cfg.RetryAfter, prob, detail)
}

// proxyRoute is the route of a proxied request: its path as sent, plus the
// query when there is one. The engine fingerprints method, route and body;
// an upstream may act on the query, so two requests that differ only there
// must not share a record (the engine's default route drops the query).
// The path is always ASCII (net/url escapes what was not); checkRoute
// bounds the whole before it reaches a scope.
func proxyRoute(r *http.Request) string {
	route := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		route += "?" + r.URL.RawQuery
	}
	return route
}

// maxRouteBytes bounds the route of a keyed request: with the method and
// the longest tenant id (maxTrustedTenant, or a hashed source's label), its
// scope stays within what every store accepts (store.MaxScopeBytes).
const maxRouteBytes = 640

// checkRoute refuses a route that must not become part of a scope: raw
// bytes outside visible ASCII (RFC 3986 wants them percent-encoded; a
// query may carry them through net/http as sent, even invalid UTF-8),
// and routes longer than maxRouteBytes.
func checkRoute(route string) (problem proxyProblem, bad bool) {
	for i := 0; i < len(route); i++ {
		if c := route[i]; c <= ' ' || c >= 0x7f {
			return probTargetInvalid, true
		}
	}
	if len(route) > maxRouteBytes {
		return probTargetTooLong, true
	}
	return proxyProblem{}, false
}

// runProxy is `idem proxy`.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, logFormat, logLevel, err := parseProxyFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.Logger, err = newLogger(stderr, logFormat, logLevel); err != nil {
		return refusedUsage(stderr, fmt.Errorf("%w: %w", ErrUsage, err))
	}
	p, err := NewProxy(ctx, cfg)
	if err != nil {
		return refusedUsage(stderr, err)
	}
	return p.Serve(ctx)
}

// proxySynopsis is the usage text of idem proxy.
const proxySynopsis = `--upstream URL [flags]

Puts the idempotency engine in front of the API at --upstream: a request
under an Idempotency-Key runs once, and its retries get the first answer.

Duplicates in flight (a retry that arrives while its first attempt still
runs, as Go's transport and most SDKs send them): the duplicate waits up to
--wait (5s) for the first answer to be stored and gets it replayed. After
the wait, or at once with --wait 0, it gets --in-progress-status with
Retry-After: under --profile ietf 409 (every retrying client retries it) or
202 (only for clients that read the problem type of a 2xx: Stripe's SDKs,
Python requests and anything that takes 2xx for done would take it for the
result); under --profile stripe 429 with the code lock_timeout and
Stripe-Should-Retry: true (the one refusal stripe-go retries, unlike
Stripe's own 409 idempotency_key_in_use, which --in-progress-status 409
gives). 202 is refused with --profile stripe. Each waiting duplicate holds
its connection and reads the store about four times a second.

While it serves, the proxy runs the background services, unless
--maintenance=false: the sweeper moves in-progress records whose lease
expired (their holder crashed) to unknown every --sweep-interval, the
reaper deletes expired records every --reap-interval, and with
--resolve-url the reconciler asks the upstream's operators about unknown
outcomes every --reconcile-interval. Several proxies on one store may all
run them. Without a reconciler, settle unknown records with
idem reconcile resolve (or idem reconcile run).

With --admin, /metrics serves the engine's metrics in the Prometheus format
(idem_reserve_outcomes_total{outcome=...}, idem_store_errors_total,
idem_store_duration_seconds, idem_zombies_swept_total, ...).
With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set,
the proxy exports its spans over OTLP/HTTP; it continues the caller's W3C
traceparent and passes it on to the upstream.

Asynchronous routes: --async 'POST /v1/reports' (repeatable; a method and a
ServeMux path pattern) records a keyed request on that route and answers 202
Accepted at once, with Location: /.idem/requests/ID and Retry-After; a
worker of any proxy on the store (--async-workers each, 0 for none) forwards
it to the upstream once and stores the answer, which retries with the key and
GET Location (same tenant only) then replay. A request no worker claims
within --async-wait ends with a stored 408. Authorization and Cookie are
never stored unless --async-keep-headers names them. A route of the config
file with "async": true is the same as --async for its pattern (both may be
given: one route, with the file's key-required, fields and lease-policy; an
asynchronous route takes no ttl or lease and cannot be "protected": false).
Asynchronous patterns are matched before the file's other routes.
Per-tenant protection (off by default): --tenant-rate limits the new keys
a tenant sends a second (key spraying: a client minting a fresh key per
request to defeat deduplication, or filling the store), per proxy;
--tenant-max-active caps the records a tenant holds in progress or
awaiting reconciliation, counted by the store across every proxy on it
(a client holding many keys in flight, or probing for keys). Over either:
429 with Retry-After, nothing reserved, nothing forwarded. Replays and
duplicates in flight are never charged. --tenant-max-active is not for a
Redis store, which cannot count a tenant's records atomically (the proxy
refuses to start). --new-key-rate bounds the new keys the proxy takes from
all tenants together, a second: a client minting a fresh credential for
every request makes a new tenant each time, which the per-tenant limits
cannot see.

Store circuit breaker: after --breaker-failures failed reservations in a
row, requests get 503 with Retry-After at once, without waiting for the
store (up to its 5s timeout each), for --breaker-open; then one request at a
time probes the store: a success closes the breaker, a failure opens it
again for twice as long, up to --breaker-max-open. Logged and counted
(idem_breaker_opened_total, idem_breaker_closed_total).

Every stored answer and every replay carries Idempotency-Key-Expires, the
HTTP-date until which the key's answer is replayed (a --ttl after the
answer was stored).

Resource limits: --max-header-bytes (431 above it), --body-timeout (a
client that stalls while sending its body is cut off, its connection
closed), --max-buffered-bytes (keyed requests whose bodies would exceed it
are answered 503 with Retry-After at once). Methods that are not upper
case are refused with 400. If the store cannot be opened at start, the
proxy serves anyway: protected requests get 503 and /readyz is not ready
until the store opens (retried in the background, migrated with --migrate).

` + tenantSourcesHelp + `

` + configHelp + `

` + resolveProtocol + "\n\n" + webhookHelp

// defaultWait is --wait's default: most clients (Go's own transport,
// Stripe's SDKs) resend sooner than a slow upstream answers, and a
// duplicate that waits gets the answer instead of a refusal it must retry.
// It bounds what a duplicate storm holds: a connection and a store read
// every 250ms per waiting duplicate (README.md, "Duplicates in flight").
const defaultWait = 5 * time.Second

func parseProxyFlags(args []string, stderr io.Writer) (cfg ProxyConfig, logFormat, logLevel string, err error) {
	fs := newFlags("proxy", proxySynopsis, stderr)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "`address` the proxy listens on")
	fs.StringVar(&cfg.Upstream, "upstream", "", "base `URL` of the API behind the proxy (required)")
	storeDSN := storeFlag(fs)
	fs.BoolVar(&cfg.Migrate, "migrate", true, "apply the store's pending migrations at start")
	fs.IntVar(&cfg.StoreConns, "store-conns", 0, "connection pool `size` of a PostgreSQL or MySQL store; 0: the store's default (PostgreSQL 32 unless the URL sets pool_max_conns, MySQL no cap)")
	fs.IntVar(&cfg.StoreBatches, "store-batches", 0, "group commits a PostgreSQL store may have in flight (`slots`); 0: the store's default (1), -1: no batching; more suit a database server with many cores")
	fs.StringVar(&cfg.Profile, "profile", string(idem.ProfileIETF), "HTTP dialect: ietf (key required, 422 on reuse, problem+json) or stripe")
	configFile := fs.String("config", "", "JSON `file` of settings and per-route settings (see above)")
	fs.DurationVar(&cfg.TTL, "ttl", idem.DefaultTTL, "how long a completed response is replayed")
	fs.DurationVar(&cfg.Lease, "lease", idem.DefaultLease, "lease of an execution, renewed while the upstream works")
	leasePolicy := choiceFlag{value: string(store.LeaseUnknown), valid: func(v string) bool { return store.LeasePolicy(v).Valid() },
		want: "unknown, retry or resume"}
	fs.Var(&leasePolicy, "lease-policy", "`policy` for a retry that finds the holder of the key died: unknown (settled by the reconciler or an operator), retry (runs again) or resume (runs again, told it resumes)")
	keyRequired := optionalBool{}
	fs.Var(&keyRequired, "key-required", "refuse a protected request without a key (400): true, false (it passes through), or profile (true under ietf, false under stripe)")
	keyReused := statusFlag{zero: "profile", check: func(n int) error {
		if n < 400 || n > 499 {
			return errors.New("want a 4xx status")
		}
		return nil
	}}
	fs.Var(&keyReused, "key-reused-status", "`status` of a key reused with another request: a 4xx, or profile (422 under ietf, 400 under stripe)")
	inProgress := statusFlag{zero: "profile", check: func(n int) error {
		if n != http.StatusConflict && n != http.StatusAccepted && n != http.StatusTooManyRequests {
			return errors.New("want 409, 202 (ietf only) or 429 (stripe only)")
		}
		return nil
	}}
	fs.Var(&inProgress, "in-progress-status", "`status` of a duplicate of an in-flight request that --wait did not settle, with Retry-After: 409 or 202 under ietf; 429 (lock_timeout) or 409 under stripe; or profile (409 under ietf, 429 under stripe)")
	fs.DurationVar(&cfg.RetryAfter, "retry-after", idem.DefaultRetryAfter, "Retry-After of the in-flight, unknown-outcome and 503 answers (whole seconds)")
	fs.DurationVar(&cfg.StoreTimeout, "store-timeout", idem.DefaultStoreTimeout, "bound on every store call; over it the request is answered 503 before the upstream is called")
	fs.BoolVar(&cfg.StoreServerErrors, "store-server-errors", false, "keep 5xx and 408/425/429 answers as final and replay them (Stripe v1), instead of letting a retry run again")
	maxResponse := byteSize(idem.DefaultMaxResponseBytes)
	fs.Var(&maxResponse, "max-response-bytes", "largest response body `size` kept for replays; a larger answer is passed on, and its replays say the body was not kept")
	var fields listFlag
	fs.Var(&fields, "fields", "comma-separated JSON `members` that identify a request (payment.amount names a nested one); none: the whole body")
	fs.StringVar(&cfg.KeyHeader, "key-header", idem.DefaultKeyHeader, "`name` of the request header that carries the idempotency key")
	echoKey := optionalBool{}
	fs.Var(&echoKey, "echo-key", "send the key back, as sent, in --key-header on every answer to a keyed request (replays and problems too): true, false, or profile (true under stripe, where Stripe's SDKs read it, false under ietf)")
	fs.DurationVar(&cfg.Wait, "wait", defaultWait, "how long a duplicate of an in-flight request waits for the first to finish and gets its answer replayed; after it (or with 0, at once) it gets --in-progress-status")
	fs.Float64Var(&cfg.TenantRate, "tenant-rate", 0, "new keys a `second` each tenant may send, per proxy (over it: 429 tenant-rate-limited; replays and duplicates are free); 0: no limit")
	fs.IntVar(&cfg.TenantBurst, "tenant-burst", 0, "new keys a tenant may send at once under --tenant-rate; 0: one second's worth")
	fs.Float64Var(&cfg.NewKeyRate, "new-key-rate", 0, "new keys a `second` this proxy takes from all tenants together (over it: 429 new-keys-limited; replays and duplicates are free); 0: no limit")
	fs.IntVar(&cfg.NewKeyBurst, "new-key-burst", 0, "new keys the proxy takes at once under --new-key-rate; 0: one second's worth")
	fs.IntVar(&cfg.TenantMaxActive, "tenant-max-active", 0, "`records` a tenant may hold waiting for a worker (--async), in progress or awaiting reconciliation, across every proxy on the store (over it: 429 tenant-over-cap); 0: no cap")
	breakerFailures := fs.Int("breaker-failures", idem.DefaultBreakerFailures, "store failures in a row that open the circuit breaker (503 at once, without waiting for the store); 0: no breaker")
	fs.DurationVar(&cfg.BreakerOpen, "breaker-open", idem.DefaultBreakerOpen, "first interval the circuit breaker stays open before one request probes the store; it doubles while probes fail")
	fs.DurationVar(&cfg.BreakerMaxOpen, "breaker-max-open", idem.DefaultBreakerMaxOpen, "bound on the circuit breaker's interval as it doubles")
	var tenantFrom listFlag
	fs.Func("tenant-from", "tenant `source`: authorization, header:NAME, cookie:NAME or trusted-header:NAME (repeatable or comma-separated; the first present wins; see above)", func(v string) error {
		if _, err := parseTenantSources([]string{v}); err != nil {
			return err
		}
		tenantFrom = append(tenantFrom, v)
		return nil
	})
	fs.StringVar(&cfg.TenantHeader, "tenant-header", "", "deprecated: --tenant-from trusted-header:`NAME`")
	fs.BoolVar(&cfg.SingleTenant, "single-tenant", false, "one trusted caller: every request shares one tenant (instead of --tenant-from)")
	tenantSecretFile := fs.String("tenant-secret-file", "", "`file` holding the secret that keys the tenant hashes (else $"+tenantSecretEnv+")")
	fpSecretFile := fs.String("fingerprint-secret-file", "", "`file` holding the secret that keys request fingerprints (else $"+fingerprintSecretEnv+"; none: plain SHA-256)")
	maxHeader := byteSize(defaultMaxHeaderBytes)
	fs.Var(&maxHeader, "max-header-bytes", "largest request line and headers `size` (larger: 431)")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", defaultBodyTimeout, "time a client gets to send a request body; a stalled client is cut off (0: no limit)")
	maxBuffered := byteSize(defaultMaxBufferedBytes)
	fs.Var(&maxBuffered, "max-buffered-bytes", "bound on the `size` of the request bodies held in memory at once (over it: 503 + Retry-After at once); at least --max-body")
	methods := listFlag{http.MethodPost, http.MethodPatch}
	fs.Var(&methods, "methods", "comma-separated `methods` under idempotency keys; others pass through")
	maxBody := byteSize(idem.DefaultMaxBodyBytes)
	fs.Var(&maxBody, "max-body", "largest request `size` fingerprinted (larger: 413), e.g. 1MiB")
	fs.DurationVar(&cfg.UpstreamTimeout, "upstream-timeout", 60*time.Second, "wait for the upstream's response headers (after it, the outcome is unknown); 0 for no limit")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 20*time.Second, "time in-flight requests get to finish at shutdown")
	fs.StringVar(&cfg.Admin, "admin", "", "`address` of the admin server (/healthz, /readyz, /metrics); off when empty")
	fs.BoolVar(&cfg.Console, "console", true, "serve the operations console at /console/ on --admin (credentials from $IDEM_CONSOLE_TOKEN or $IDEM_CONSOLE_USER/$IDEM_CONSOLE_PASSWORD; required unless --admin is loopback)")
	cfg.ConsoleCredentials = console.CredentialsFromEnv()
	cacheDSN := cacheFlag(fs, "Redis `URL` of a replay cache in front of the store: "+storeurl.CacheSupported)
	runMaintenance := fs.Bool("maintenance", true, "run the background services: sweeper, reaper, and reconciler (with --resolve-url)")
	fs.DurationVar(&cfg.Maintenance.SweepInterval, "sweep-interval", maintenance.DefaultSweepInterval, "how often expired leases are swept to unknown")
	fs.DurationVar(&cfg.Maintenance.ReapInterval, "reap-interval", maintenance.DefaultReapInterval, "how often expired records are reaped")
	fs.DurationVar(&cfg.Maintenance.ReconcileInterval, "reconcile-interval", maintenance.DefaultReconcileInterval, "how often due unknown records are sent to --resolve-url")
	fs.BoolVar(&cfg.Maintenance.SoftExpire, "soft-expire", false, "keep expired records as state expired (audit) instead of deleting them")
	fs.StringVar(&cfg.ResolveURL, "resolve-url", "", "`URL` the reconciler asks about unknown outcomes (protocol above); no reconciler when empty")
	webhook := registerWebhookFlags(fs)
	fs.Func("async", "asynchronous `route`, as a method and a ServeMux path pattern, e.g. 'POST /v1/reports' (repeatable, or a comma list as from the environment or a config file's array): keyed requests get 202 + Location at once and the proxy's worker forwards them", func(v string) error {
		cfg.Async = append(cfg.Async, splitPatterns(v)...)
		return nil
	})
	fs.DurationVar(&cfg.AsyncWait, "async-wait", 0, "how long an asynchronous request waits for a worker before it ends with 408 (0: 1h, or --ttl when shorter)")
	fs.IntVar(&cfg.AsyncWorkers, "async-workers", idem.DefaultWorkerConcurrency, "asynchronous requests this proxy forwards at once; 0: none (this proxy only accepts them, others on the store forward them)")
	fs.DurationVar(&cfg.AsyncPoll, "async-poll", idem.DefaultWorkerPoll, "how long an idle worker waits before it looks for new asynchronous requests again")
	var asyncKeep listFlag
	fs.Var(&asyncKeep, "async-keep-headers", "comma-separated sensitive `headers` (Authorization, Cookie) kept with asynchronous requests for the upstream; never stored otherwise")
	fs.BoolVar(&cfg.RequireSynchronousReplication, "require-synchronous-replication", false, "refuse protected requests (503 store-not-durable) while the store's check says acknowledged answers could be lost by a failover or restart: PostgreSQL standbys that commits do not wait for, Redis without appendonly or with replicas writes do not wait for, MySQL replicas without semi-sync")
	fs.DurationVar(&cfg.DurabilityInterval, "durability-check-interval", idem.DefaultDurabilityInterval, "how often the store's durability (replication, persistence settings) is checked again; a change is logged, and --require-synchronous-replication follows it")
	fs.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pos, err := parse(fs, args)
	if err != nil {
		return cfg, "", "", err
	}
	if len(pos) > 0 {
		return cfg, "", "", usageErr(fs, "unexpected argument %q", pos[0])
	}
	if *configFile != "" {
		if cfg.Routes, err = loadConfig(fs, *configFile); err != nil {
			return cfg, "", "", usageErr(fs, "--config: %v", err)
		}
	}
	if cfg.Upstream == "" {
		return cfg, "", "", usageErr(fs, "--upstream is required")
	}
	switch {
	case cfg.StoreConns < 0:
		return cfg, "", "", usageErr(fs, "--store-conns must be 0 (the store's default) or a positive pool size")
	case cfg.StoreBatches < -1:
		return cfg, "", "", usageErr(fs, "--store-batches must be -1 (no batching), 0 (the store's default) or a number of store batches")
	case cfg.TenantRate < 0 || cfg.TenantBurst < 0 || cfg.TenantMaxActive < 0:
		return cfg, "", "", usageErr(fs, "--tenant-rate, --tenant-burst and --tenant-max-active must not be negative")
	case cfg.NewKeyRate < 0 || cfg.NewKeyBurst < 0:
		return cfg, "", "", usageErr(fs, "--new-key-rate and --new-key-burst must not be negative")
	case *breakerFailures < 0:
		return cfg, "", "", usageErr(fs, "--breaker-failures must not be negative (0 turns the breaker off)")
	case cfg.BreakerOpen <= 0 || cfg.BreakerMaxOpen < cfg.BreakerOpen:
		return cfg, "", "", usageErr(fs, "--breaker-open must be positive and --breaker-max-open at least as long")
	case *breakerFailures == 0:
		cfg.BreakerFailures = -1
	default:
		cfg.BreakerFailures = *breakerFailures
	}
	if err := storeDSN.resolve(fs); err != nil {
		return cfg, "", "", err
	}
	if err := cacheDSN.resolve(fs); err != nil {
		return cfg, "", "", err
	}
	cfg.Store, cfg.Cache = storeDSN.value, cacheDSN.value
	cfg.TenantFrom = tenantFrom
	if cfg.SingleTenant && (len(tenantFrom) > 0 || cfg.TenantHeader != "") {
		return cfg, "", "", usageErr(fs, "--single-tenant and --tenant-from exclude each other")
	}
	if cfg.TenantSecret, err = readSecret(*tenantSecretFile, tenantSecretEnv, "tenant"); err != nil {
		return cfg, "", "", usageErr(fs, "%v", err)
	}
	if cfg.FingerprintSecret, err = readSecret(*fpSecretFile, fingerprintSecretEnv, "fingerprint"); err != nil {
		return cfg, "", "", usageErr(fs, "%v", err)
	}
	cfg.MaxHeaderBytes = int(min(maxHeader, 1<<30))
	cfg.MaxBufferedBytes = int64(maxBuffered)
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = -1 // the flag's 0 means no limit
	}
	if cfg.MaxBufferedBytes < int64(maxBody) {
		return cfg, "", "", usageErr(fs, "--max-buffered-bytes must be at least --max-body")
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = -1 // the flag's 0 means no limit
	}
	for name, d := range map[string]time.Duration{
		"sweep-interval": cfg.Maintenance.SweepInterval, "reap-interval": cfg.Maintenance.ReapInterval,
		"reconcile-interval": cfg.Maintenance.ReconcileInterval,
	} {
		if d <= 0 {
			return cfg, "", "", usageErr(fs, "--%s must be positive", name)
		}
	}
	cfg.NoMaintenance = !*runMaintenance
	if cfg.Webhook, err = webhook.config(fs, cfg.Admin); err != nil {
		return cfg, "", "", err
	}
	if cfg.NoMaintenance && cfg.ResolveURL != "" {
		return cfg, "", "", usageErr(fs, "--resolve-url needs the background services: drop --maintenance=false")
	}
	if cfg.ResolveURL != "" {
		if _, err := newHTTPResolver(cfg.ResolveURL); err != nil {
			return cfg, "", "", usageErr(fs, "%v", err)
		}
	}
	if cfg.Cache != "" {
		if _, err := storeurl.ParseCache(cfg.Cache); err != nil {
			return cfg, "", "", usageErr(fs, "--cache: %v", err)
		}
	}
	for i, m := range methods {
		methods[i] = strings.ToUpper(m)
	}
	cfg.Methods = methods
	cfg.MaxBody = int64(maxBody)
	cfg.LeasePolicy = leasePolicy.value
	cfg.KeyRequired = keyRequired.v
	cfg.EchoKey = cfg.Profile == string(idem.ProfileStripe)
	if echoKey.v != nil {
		cfg.EchoKey = *echoKey.v
	}
	cfg.KeyReusedStatus = keyReused.n
	cfg.InProgressStatus = inProgress.n
	switch stripe := cfg.Profile == string(idem.ProfileStripe); {
	case stripe && cfg.InProgressStatus == http.StatusAccepted:
		return cfg, "", "", usageErr(fs, "--in-progress-status 202 cannot be used with --profile stripe: Stripe's SDKs "+
			"take any 2xx for the result of the call; use 429 (the stripe default, retried by every Stripe SDK) or 409")
	case !stripe && cfg.InProgressStatus == http.StatusTooManyRequests:
		return cfg, "", "", usageErr(fs, "--in-progress-status 429 is for --profile stripe (Stripe's lock_timeout); under ietf use 409 or 202")
	}
	cfg.MaxResponseBytes = int(min(maxResponse, 1<<31-1))
	cfg.Fields = fields
	cfg.AsyncKeepHeaders = asyncKeep
	if cfg.AsyncWorkers < 0 {
		return cfg, "", "", usageErr(fs, "--async-workers must not be negative")
	}
	if cfg.AsyncPoll <= 0 {
		return cfg, "", "", usageErr(fs, "--async-poll must be positive")
	}
	if cfg.DurabilityInterval <= 0 {
		return cfg, "", "", usageErr(fs, "--durability-check-interval must be positive")
	}
	if _, err := cfg.checkSettings(); err != nil {
		return cfg, "", "", usageErr(fs, "%v", err)
	}
	return cfg, logFormat, logLevel, nil
}
