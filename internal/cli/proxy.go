package cli

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/console"
	"github.com/idem-go/idem/internal/storeurl"
	"github.com/idem-go/idem/store"
	"go.opentelemetry.io/otel/metric"
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

	// TenantHeader names a request header that holds the caller's tenant,
	// set by a trusted gateway in front of the proxy (a client could set
	// it too). Empty: the tenant is a hash of the Authorization header.
	TenantHeader string
	// TenantSecret, when set, keys the Authorization hash (HMAC-SHA-256),
	// so a leaked store does not let anyone test guessed credentials
	// against the scopes.
	TenantSecret []byte

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
	// Console serves the operations console at /console/ on the admin
	// server, authenticated by ConsoleCredentials (required unless Admin is
	// a loopback address).
	Console            bool
	ConsoleCredentials console.Credentials

	// NoMaintenance turns off the background services the proxy runs
	// while it serves (sweeper, reaper, and the reconciler when there is a
	// resolver). Another instance, or scheduled idem sweep / reap /
	// reconcile run, must then do their work.
	NoMaintenance bool
	// Maintenance configures the background services; zero fields take
	// the defaults of idem.MaintenanceConfig.
	Maintenance idem.MaintenanceConfig
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
}

// Proxy is the idempotency reverse proxy: the engine's middleware in front
// of an httputil.ReverseProxy to the upstream.
type Proxy struct {
	cfg       ProxyConfig
	log       *slog.Logger
	store     store.Store
	engine    *idem.Engine
	upstream  *url.URL
	transport *http.Transport
	handler   http.Handler
	metrics   *metrics         // nil when the caller brought its own provider
	maint     *idem.Maintainer // nil with NoMaintenance

	ln       net.Listener
	server   *http.Server
	adminLn  net.Listener
	admin    *http.Server
	draining atomic.Bool
}

// NewProxy opens the store and binds the listeners; Serve starts serving.
// Binding here lets a caller read Addr before serving, and a port conflict
// fail before anything runs.
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

	if cfg.NoMaintenance && cfg.ResolveURL != "" {
		return nil, errors.New("proxy: --resolve-url needs the background services (drop --maintenance=false)")
	}
	if cfg.ResolveURL != "" && cfg.Maintenance.Resolver == nil {
		r, err := newHTTPResolver(cfg.ResolveURL)
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		cfg.Maintenance.Resolver = r
	}

	p := &Proxy{cfg: cfg, log: cfg.Logger, upstream: up}
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
	if p.store, err = storeurl.Open(ctx, cfg.Store, storeurl.Options{
		Migrate: cfg.Migrate, Clock: cfg.StoreClock, Cache: cfg.Cache, Logger: cfg.Logger,
	}); err != nil {
		return nil, err
	}
	p.engine, err = idem.New(p.store, idem.Config{
		Profile:       idem.Profile(cfg.Profile),
		Methods:       cfg.Methods,
		TTL:           cfg.TTL,
		Lease:         cfg.Lease,
		Wait:          cfg.Wait,
		MaxBodyBytes:  cfg.MaxBody,
		Tenant:        tenantFunc(cfg.TenantHeader, cfg.TenantSecret),
		Route:         proxyRoute,
		Logger:        cfg.Logger,
		MeterProvider: cfg.MeterProvider,
	})
	if err != nil {
		return nil, err
	}
	if !cfg.NoMaintenance {
		p.maint = p.engine.Maintainer(cfg.Maintenance)
	}
	p.transport = newTransport(cfg.UpstreamTimeout)
	rp := &httputil.ReverseProxy{
		Rewrite:      p.rewrite,
		Transport:    p.transport,
		ErrorHandler: p.upstreamError,
		ErrorLog:     slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	p.handler = p.engine.Middleware(rp)

	if p.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	p.server = &http.Server{
		Handler: p.handler,
		// Bounds slow clients sending headers; bodies and upstream calls
		// are bounded by the engine's body limit and UpstreamTimeout.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
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
		p.admin = &http.Server{
			Handler:           AdminMux(p.ready, cfg.AdminHandlers),
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		}
	}
	p.log.Info("idem proxy listening", "listen", p.ln.Addr().String(), "upstream", up.Redacted(),
		"store", string(dsn.Kind), "cache", cfg.Cache != "", "admin", adminString(p.adminLn),
		"maintenance", p.maint != nil, "reconciler", p.maint != nil && cfg.Maintenance.Resolver != nil)
	return p, nil
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

// Store returns the proxy's store; Serve closes it on return.
func (p *Proxy) Store() store.Store { return p.store }

// Handler returns the proxy's handler (engine middleware and reverse proxy).
func (p *Proxy) Handler() http.Handler { return p.handler }

// Serve serves, and runs the background services, until ctx is cancelled
// or a server fails, then shuts down gracefully: readiness turns 503,
// in-flight requests get ShutdownTimeout to finish, the background
// services stop, and the store is closed last, so every request that ran
// could record its outcome. It returns nil after a clean shutdown.
func (p *Proxy) Serve(ctx context.Context) error {
	if p.maint != nil {
		if err := p.maint.Start(ctx); err != nil {
			return err
		}
	}
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
	p.transport.CloseIdleConnections()
	if p.maint != nil {
		if err := p.maint.Stop(sctx); err != nil {
			errs = append(errs, fmt.Errorf("proxy: background services: %w", err))
		}
	}
	if p.metrics != nil {
		if err := p.metrics.shutdown(sctx); err != nil {
			errs = append(errs, fmt.Errorf("proxy: metrics: %w", err))
		}
	}
	if err := p.store.Close(); err != nil {
		errs = append(errs, fmt.Errorf("proxy: close store: %w", err))
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
}

// ready is the readiness check: not while draining, and only when the
// store answers.
func (p *Proxy) ready(ctx context.Context) error {
	if p.draining.Load() {
		return errors.New("shutting down")
	}
	return p.store.Ping(ctx)
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

// sentKey marks, in an outgoing request's context, whether the transport
// wrote the request: the line between "never sent" and "maybe executed".
type sentKey struct{}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.upstream)
	pr.SetXForwarded()
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
	var detail string
	switch {
	case x != nil && sent != nil && sent.Load():
		x.Uncertain("upstream failed after the request was sent: " + err.Error())
		p.log.Warn("idem proxy: upstream failed after the request was sent; outcome unknown",
			"method", r.Method, "path", r.URL.Path, "key", x.Key(), "fence", x.Fence(), "err", err)
		detail = "The upstream failed after the request was sent; its outcome is unknown, so it will not be executed again until it is reconciled."
	case x != nil:
		p.log.Warn("idem proxy: upstream unreachable; the key is released for a retry",
			"method", r.Method, "path", r.URL.Path, "key", x.Key(), "err", err)
		detail = "The request could not be sent to the upstream and was not executed; it can be retried."
	default:
		p.log.Warn("idem proxy: upstream request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		detail = "The upstream did not answer."
	}
	writeBadGateway(w, idem.Profile(p.cfg.Profile), detail)
}

// writeBadGateway answers 502 in the profile's error shape.
func writeBadGateway(w http.ResponseWriter, profile idem.Profile, detail string) {
	var body []byte
	if profile == idem.ProfileStripe {
		w.Header().Set("Content-Type", "application/json")
		body, _ = json.Marshal(map[string]any{"error": map[string]string{"type": "api_error", "message": detail}})
	} else {
		w.Header().Set("Content-Type", "application/problem+json")
		body, _ = json.Marshal(map[string]any{"type": "about:blank", "title": "Bad Gateway", "status": http.StatusBadGateway, "detail": detail})
	}
	w.WriteHeader(http.StatusBadGateway)
	w.Write(body)
}

// tenantFunc returns how the proxy names the caller. Keys of two tenants
// never meet, so two credentials never share a key.
//
// With a tenant header, the tenant is its value ("" when absent). Without,
// it is "auth:" and the first 128 bits, in hex, of SHA-256 (HMAC-SHA-256
// with a secret) over the Authorization header's values joined by "\n"; ""
// without Authorization. Hashing keeps credentials out of the store.
func tenantFunc(header string, secret []byte) func(*http.Request) string {
	if header != "" {
		name := http.CanonicalHeaderKey(header)
		return func(r *http.Request) string { return strings.Join(r.Header.Values(name), ",") }
	}
	return func(r *http.Request) string {
		auth := r.Header.Values("Authorization")
		if len(auth) == 0 {
			return ""
		}
		var h hash.Hash
		if len(secret) > 0 {
			h = hmac.New(sha256.New, secret)
		} else {
			h = sha256.New()
		}
		for i, v := range auth {
			if i > 0 {
				h.Write([]byte{'\n'})
			}
			io.WriteString(h, v)
		}
		return "auth:" + hex.EncodeToString(h.Sum(nil)[:16])
	}
}

// proxyRoute is the route of a proxied request: its path as sent, plus the
// query when there is one. The engine fingerprints method, route and body;
// an upstream may act on the query, so two requests that differ only there
// must not share a record (the engine's default route drops the query).
func proxyRoute(r *http.Request) string {
	route := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		route += "?" + r.URL.RawQuery
	}
	return route
}

// runProxy is `idem proxy`.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, logFormat, logLevel, err := parseProxyFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.Logger, err = newLogger(stderr, logFormat, logLevel); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if s := os.Getenv(tenantSecretEnv); s != "" {
		cfg.TenantSecret = []byte(s)
	}
	p, err := NewProxy(ctx, cfg)
	if err != nil {
		return err
	}
	return p.Serve(ctx)
}

// proxySynopsis is the usage text of idem proxy.
const proxySynopsis = `--upstream URL [flags]

Puts the idempotency engine in front of the API at --upstream: a request
under an Idempotency-Key runs once, and its retries get the first answer.

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

` + resolveProtocol

// tenantSecretEnv names the environment variable holding the key of the
// Authorization hash: a secret stays out of the process list.
const tenantSecretEnv = "IDEM_TENANT_SECRET"

func parseProxyFlags(args []string, stderr io.Writer) (cfg ProxyConfig, logFormat, logLevel string, err error) {
	fs := newFlags("proxy", proxySynopsis, stderr)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "`address` the proxy listens on")
	fs.StringVar(&cfg.Upstream, "upstream", "", "base `URL` of the API behind the proxy (required)")
	fs.StringVar(&cfg.Store, "store", storeurl.Default, "store `DSN`: "+storeurl.Supported)
	fs.BoolVar(&cfg.Migrate, "migrate", true, "apply the store's pending migrations at start")
	fs.StringVar(&cfg.Profile, "profile", string(idem.ProfileIETF), "HTTP dialect: ietf (key required, 422 on reuse, problem+json) or stripe")
	fs.DurationVar(&cfg.TTL, "ttl", 24*time.Hour, "how long a completed response is replayed")
	fs.DurationVar(&cfg.Lease, "lease", 30*time.Second, "lease of an execution, renewed while the upstream works")
	fs.DurationVar(&cfg.Wait, "wait", 0, "let a duplicate of an in-flight request wait this long and replay, instead of 409 at once")
	fs.StringVar(&cfg.TenantHeader, "tenant-header", "", "request header `NAME` holding the tenant, set by a trusted gateway; default: a hash of Authorization (keyed by $"+tenantSecretEnv+" when set)")
	methods := listFlag{http.MethodPost, http.MethodPatch}
	fs.Var(&methods, "methods", "comma-separated `methods` under idempotency keys; others pass through")
	maxBody := byteSize(1 << 20)
	fs.Var(&maxBody, "max-body", "largest request `size` fingerprinted (larger: 413), e.g. 1MiB")
	fs.DurationVar(&cfg.UpstreamTimeout, "upstream-timeout", 60*time.Second, "wait for the upstream's response headers (after it, the outcome is unknown); 0 for no limit")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 20*time.Second, "time in-flight requests get to finish at shutdown")
	fs.StringVar(&cfg.Admin, "admin", "", "`address` of the admin server (/healthz, /readyz, /metrics); off when empty")
	fs.BoolVar(&cfg.Console, "console", true, "serve the operations console at /console/ on --admin (credentials from $IDEM_CONSOLE_TOKEN or $IDEM_CONSOLE_USER/$IDEM_CONSOLE_PASSWORD; required unless --admin is loopback)")
	cfg.ConsoleCredentials = console.CredentialsFromEnv()
	fs.StringVar(&cfg.Cache, "cache", "", "Redis `URL` of a replay cache in front of the store: "+storeurl.CacheSupported)
	maintenance := fs.Bool("maintenance", true, "run the background services: sweeper, reaper, and reconciler (with --resolve-url)")
	fs.DurationVar(&cfg.Maintenance.SweepInterval, "sweep-interval", 15*time.Second, "how often expired leases are swept to unknown")
	fs.DurationVar(&cfg.Maintenance.ReapInterval, "reap-interval", time.Minute, "how often expired records are reaped")
	fs.DurationVar(&cfg.Maintenance.ReconcileInterval, "reconcile-interval", 10*time.Second, "how often due unknown records are sent to --resolve-url")
	fs.BoolVar(&cfg.Maintenance.SoftExpire, "soft-expire", false, "keep expired records as state expired (audit) instead of deleting them")
	fs.StringVar(&cfg.ResolveURL, "resolve-url", "", "`URL` the reconciler asks about unknown outcomes (protocol above); no reconciler when empty")
	fs.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pos, err := parse(fs, args)
	if err != nil {
		return cfg, "", "", err
	}
	if len(pos) > 0 {
		return cfg, "", "", usageErr(fs, "unexpected argument %q", pos[0])
	}
	if cfg.Upstream == "" {
		return cfg, "", "", usageErr(fs, "--upstream is required")
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
	cfg.NoMaintenance = !*maintenance
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
	return cfg, logFormat, logLevel, nil
}
