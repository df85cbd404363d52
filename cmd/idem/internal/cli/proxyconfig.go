package cli

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/maintenance"
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
	// StoreReplayCache and StoreListen set a PostgreSQL store's replay
	// cache (storeurl.Options.ReplayCache and ListenURL).
	StoreReplayCache int64
	StoreListen      string
	// StorePartitions makes a new PostgreSQL store partitioned by
	// retention (storeurl.Options.Partitions). Zero keeps the plain table.
	StorePartitions time.Duration
	// StoreClock replaces the store's clock (tests).
	StoreClock store.Clock

	// Config holds the engine's settings, as idem.Config documents them;
	// zero keeps the engine's default. RequireDurable is only for a
	// PostgreSQL, MySQL or Redis store, and AsyncWait and AsyncKeepHeaders
	// apply to the asynchronous routes only. The proxy sets the engine's
	// Tenant (the guard's), Route, Logger (the one below), Observer, and
	// the asynchronous engine's Async, AsyncQueue, AsyncDropHeaders and
	// StatusPath itself: what they hold here is not used.
	idem.Config

	// Routes are per-route settings, matched in ServeMux fashion; a
	// request no route matches takes the settings above.
	Routes []RouteConfig

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

	// MaxHeaderBytes bounds the request line and headers (431 above it).
	// Defaults to 64 KiB.
	MaxHeaderBytes int
	// BodyTimeout bounds the time to receive a request body; a client that
	// stalls is cut off and its connection closed. Defaults to 30s;
	// negative means no limit.
	BodyTimeout time.Duration
	// MaxBufferedBytes bounds the request bodies held in memory at once
	// by keyed requests (each counts its Content-Length, or MaxBodyBytes
	// when unknown, up to MaxBodyBytes). A request over the bound is
	// answered 503 with Retry-After at once. Defaults to 64 MiB; it must
	// be at least MaxBodyBytes.
	MaxBufferedBytes int64

	// UpstreamTimeout bounds the wait for the upstream's response headers
	// once the request was sent. Defaults to 60s; negative means no limit.
	UpstreamTimeout time.Duration
	// GCHeadroom is the heap growth the proxy command allows between
	// garbage collections while its live heap is smaller (package
	// heapfloor); zero leaves Go's default pace. NewProxy ignores it: the
	// collector's pace is the process's, set by the command.
	GCHeadroom int64
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
	// AsyncWorkers is how many asynchronous requests this proxy forwards
	// at once. Zero: this proxy runs no worker and only accepts requests
	// (other proxies on the store forward them).
	AsyncWorkers int
	// AsyncPoll is how long an idle worker waits before it looks for new
	// requests again. Zero: idem.DefaultWorkerPoll.
	AsyncPoll time.Duration
}

// Defaults of the proxy's listener, upstream calls and resource limits.
const (
	defaultListen           = "127.0.0.1:8080"
	defaultUpstreamTimeout  = 60 * time.Second
	defaultShutdownTimeout  = 20 * time.Second
	defaultGCHeadroom       = "32MiB"
	defaultMaxHeaderBytes   = 64 << 10
	defaultBodyTimeout      = 30 * time.Second
	defaultMaxBufferedBytes = 64 << 20
)

// withDefaults returns cfg with its defaults applied, or why it cannot
// serve.
func (cfg ProxyConfig) withDefaults() (ProxyConfig, error) {
	if cfg.Listen == "" {
		cfg.Listen = defaultListen
	}
	if cfg.Store == "" {
		cfg.Store = storeurl.Default
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = defaultUpstreamTimeout
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = defaultShutdownTimeout
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = defaultMaxHeaderBytes
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = defaultBodyTimeout
	}
	if cfg.KeyHeader != "" && !httpfield.Valid(cfg.KeyHeader, nil) {
		return cfg, configErr("proxy: --key-header %q is not a valid header name", cfg.KeyHeader)
	}
	// The guard, the resolver and the webhook read these engine settings
	// before any engine is built: they take the engine's own defaults, and
	// the key header its canonical spelling, which the guard looks it up
	// by. What else is wrong with the settings, New reports
	// (checkSettings).
	eng, _ := cfg.Config.WithDefaults()
	cfg.MaxBodyBytes, cfg.MaxResponseBytes = eng.MaxBodyBytes, eng.MaxResponseBytes
	cfg.RetryAfter, cfg.KeyHeader = eng.RetryAfter, eng.KeyHeader
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = defaultMaxBufferedBytes
	}
	if cfg.MaxBufferedBytes < cfg.MaxBodyBytes {
		return cfg, configErr("proxy: --max-buffered-bytes (%d) is smaller than --max-body (%d): no body would fit", cfg.MaxBufferedBytes, cfg.MaxBodyBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return cfg, nil
}

// checkStore refuses, before the store is reached, settings the store of
// dsn cannot serve.
func (cfg ProxyConfig) checkStore(dsn storeurl.DSN) error {
	if cfg.StoreConns < 0 {
		// The store would never open: refused at start, not retried.
		return fmt.Errorf("%w: --store-conns %d: want 0 (the store's default) or a positive pool size", ErrUsage, cfg.StoreConns)
	}
	if dsn.Kind == storeurl.Redis && cfg.TenantMaxActive > 0 {
		// Known before the store is reached: refused at once rather than
		// when it opens.
		return fmt.Errorf("%w: --tenant-max-active needs a store that counts a tenant's records (SQLite, PostgreSQL, MySQL or memory), not Redis", ErrUsage)
	}
	if dsn.Kind == storeurl.Redis && cfg.StoreMaxActive > 0 {
		return fmt.Errorf("%w: --store-max-active needs a store that counts its active records (SQLite, PostgreSQL, MySQL or memory), not Redis", ErrUsage)
	}
	// The other stores, and a PostgreSQL store without the cache, would
	// ignore these: the proxy would run without the cache it was told to
	// have.
	if cfg.StoreReplayCache != 0 && dsn.Kind != storeurl.Postgres {
		return fmt.Errorf("%w: --store-replay-cache needs a PostgreSQL store, not %s", ErrUsage, dsn.Kind)
	}
	if cfg.StoreListen != "" && cfg.StoreReplayCache == 0 {
		return fmt.Errorf("%w: --store-listen needs --store-replay-cache: only the replay cache listens", ErrUsage)
	}
	if cfg.RequireDurable && dsn.Kind != storeurl.Postgres && dsn.Kind != storeurl.MySQL && dsn.Kind != storeurl.Redis {
		return fmt.Errorf("%w: --require-synchronous-replication needs a store that checks its replication (PostgreSQL, MySQL or Redis), not %s", ErrUsage, dsn.Kind)
	}
	return nil
}

// settleResolver checks the webhook and the background services' settings
// and gives the reconciler the resolver of ResolveURL.
func (cfg *ProxyConfig) settleResolver() error {
	if cfg.TenantHeader != "" {
		cfg.Logger.Warn("idem proxy: --tenant-header is deprecated; use --tenant-from trusted-header:NAME", "name", cfg.TenantHeader)
	}
	if err := checkWebhook(cfg.Webhook, cfg.Admin); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	if cfg.NoMaintenance && cfg.ResolveURL != "" {
		return configErr("proxy: --resolve-url needs the background services (drop --maintenance=false)")
	}
	if cfg.ResolveURL != "" && cfg.Maintenance.Resolver == nil {
		r, err := newHTTPResolver(cfg.ResolveURL)
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		r.maxBody = cfg.MaxResponseBytes
		cfg.Maintenance.Resolver = r
	}
	return nil
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
	cfg.RequireDurable = false
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

// engineConfig is the engine's configuration of cfg, reporting to obs.
// The asynchronous settings are the asynchronous engine's
// (asyncEngineConfig).
func (cfg ProxyConfig) engineConfig(obs idem.Observer) idem.Config {
	c := cfg.Config
	c.Tenant, c.Route, c.Logger, c.Observer = tenantFromContext, proxyRoute, cfg.Logger, obs
	c.Async, c.AsyncQueue, c.AsyncWait, c.StatusPath = false, "", 0, ""
	c.AsyncKeepHeaders, c.AsyncDropHeaders = nil, nil
	return c
}
