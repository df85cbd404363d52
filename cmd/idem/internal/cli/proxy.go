package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/heapfloor"
	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/otelidem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// Proxy is the idempotency reverse proxy: the engine's middleware in front
// of an httputil.ReverseProxy to the upstream, behind a guard that names
// the caller's tenant and bounds what a client may make the proxy hold.
type Proxy struct {
	cfg      ProxyConfig
	log      *slog.Logger
	dsn      storeurl.DSN
	upstream *url.URL
	// basePath: the upstream URL has a path, under which every request
	// must stay (hasDotSegment).
	basePath  bool
	transport *http.Transport
	rp        http.Handler // the reverse proxy alone
	handler   http.Handler // the guard in front of everything
	metrics   *metrics     // nil when the caller brought its own provider
	refusals  metric.Int64Counter
	// durabilityGauges observes the store's durability for the metrics.
	durabilityGauges metric.Registration
	// lostGauge observes the engine's lost reservations for the metrics.
	lostGauge metric.Registration
	tracing   *tracing      // nil when the caller brought its own provider
	spansOff  bool          // no span is recorded: the proxy neither starts nor injects one
	obs       idem.Observer // the engine's and the services' metrics and spans
	tenants   *tenants
	protected map[string]bool
	routes    *routeTable // nil without Routes
	buffers   *semaphore.Weighted
	buffered  atomic.Int64 // bytes held under buffers, for tests

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

// NewProxy binds the listeners and opens the store; Serve starts serving.
// Binding here lets a caller read Addr before serving, and a port conflict
// fail before anything runs. A store that cannot be opened does not fail
// NewProxy: Serve keeps trying in the background, with backoff, while the
// proxy answers protected requests 503 and /readyz reports not ready.
func NewProxy(ctx context.Context, cfg ProxyConfig) (_ *Proxy, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	up, err := parseUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	dsn, err := storeurl.Parse(cfg.Store)
	if err != nil {
		return nil, err
	}
	if err := cfg.checkStore(dsn); err != nil {
		return nil, err
	}
	tn, err := proxyTenants(cfg, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if err := cfg.settleResolver(); err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, upstream: up, basePath: strings.Trim(up.Path, "/") != "", dsn: dsn, tenants: tn,
		buffers: semaphore.NewWeighted(cfg.MaxBufferedBytes)}
	// Undo what was set up if a later step fails.
	defer func() {
		if err != nil {
			p.closeAll()
		}
	}()
	tp, err := p.observe(ctx)
	if err != nil {
		return nil, err
	}
	// The engine's settings are checked now, whether or not the store
	// answers: a typo must fail at start, not when the database comes up.
	if p.routes, err = p.cfg.checkSettings(); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if !p.cfg.NoMaintenance {
		if _, err := maintenance.New(memory.New(memory.Config{}), p.cfg.Maintenance); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
	}
	if err := p.buildHandler(tp); err != nil {
		return nil, err
	}
	if err := p.openFirst(ctx); err != nil {
		return nil, err
	}
	if err := p.listen(); err != nil {
		return nil, err
	}
	p.log.Info("idem proxy listening", "listen", p.ln.Addr().String(), "upstream", up.Redacted(),
		"store", string(dsn.Kind), "cache", p.cfg.Cache != "", "admin", adminString(p.adminLn),
		"tenant_from", tn.String(), "maintenance", !p.cfg.NoMaintenance,
		"reconciler", !p.cfg.NoMaintenance && p.cfg.Maintenance.Resolver != nil)
	return p, nil
}

// meterName names the proxy's own meter and tracer.
const meterName = "github.com/idem-go/idem/cmd/idem/internal/cli"

// observe sets up the metrics and the spans of the proxy and its engines,
// and returns the tracer provider.
func (p *Proxy) observe(ctx context.Context) (_ trace.TracerProvider, err error) {
	cfg := &p.cfg
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
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if p.refusals, err = mp.Meter(meterName).Int64Counter("idem.proxy.refused",
		metric.WithDescription("requests the proxy refused before the engine, by reason")); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	if p.durabilityGauges, err = p.durabilityMetrics(mp.Meter(meterName)); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	if p.lostGauge, err = p.lostMetrics(mp.Meter(meterName)); err != nil {
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
	return tp, nil
}

// buildHandler builds what serves the requests before the store is open:
// the guard, the protected methods, the asynchronous routes and the
// reverse proxy to the upstream.
func (p *Proxy) buildHandler(tp trace.TracerProvider) (err error) {
	p.protected = map[string]bool{}
	for _, m := range p.cfg.Methods {
		p.protected[strings.ToUpper(m)] = true
	}
	if len(p.protected) == 0 {
		p.protected = map[string]bool{http.MethodPost: true, http.MethodPatch: true}
	}
	if p.async, err = newAsyncRoutes(p.cfg.Async, p.protected, p.routes); err != nil {
		return err
	}
	if p.async != nil && (p.cfg.AsyncWorkers < 0 || p.cfg.AsyncPoll < 0) {
		return configErr("proxy: --async-workers and --async-poll must not be negative")
	}
	p.transport = newTransport(p.cfg.UpstreamTimeout)
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		ModifyResponse: markCutAnswers,
		Transport:      p.transport,
		ErrorHandler:   p.upstreamError,
		ErrorLog:       slog.NewLogLogger(p.cfg.Logger.Handler(), slog.LevelWarn),
		BufferPool:     copyBuffers{},
	}
	// Without spans (no provider given, no collector configured) the
	// server span would record nothing, and the caller's traceparent
	// reaches the upstream as the reverse proxy copies every end-to-end
	// header: neither the span nor the propagation is worth a request copy.
	p.spansOff = p.cfg.TracerProvider == nil && p.tracing.provider == nil
	p.handler = http.HandlerFunc(p.guard)
	if !p.spansOff {
		p.handler = traced(tp.Tracer(meterName), p.handler)
	}
	return nil
}

// listen binds the proxy's listener and, with an admin address, the
// admin server's with its handlers.
func (p *Proxy) listen() (err error) {
	cfg := &p.cfg
	if p.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("proxy: listen: %w", err)
	}
	// Slow clients are bounded while sending headers here, while sending
	// a body by BodyTimeout (see guard), and while idle between requests;
	// upstream calls by UpstreamTimeout.
	p.server = cfg.limitedServer(p.handler)
	if cfg.AdminHandlers, err = p.mountWebhook(cfg.AdminHandlers); err != nil {
		return err
	}
	if cfg.Admin == "" {
		return nil
	}
	if cfg.Console {
		if err := p.mountConsole(cfg); err != nil {
			return err
		}
	}
	if p.adminLn, err = net.Listen("tcp", cfg.Admin); err != nil {
		return fmt.Errorf("proxy: admin listen: %w", err)
	}
	p.admin = cfg.limitedServer(adminLimits(AdminMux(p.ready, cfg.AdminHandlers), cfg.BodyTimeout))
	return nil
}

// openFirst opens the store at start. A store that does not open is not
// an error: Serve retries it in the background.
func (p *Proxy) openFirst(ctx context.Context) error {
	s, err := p.openStore(ctx)
	if err != nil {
		p.openErr = err
		p.log.Warn("idem proxy: the store is unavailable; protected requests get 503 while it is retried in the background",
			"store", string(p.dsn.Kind), "err", err)
		return nil
	}
	if err := p.attach(s); err != nil {
		s.Close()
		return err
	}
	return nil
}

// openStore opens the store once.
func (p *Proxy) openStore(ctx context.Context) (store.Store, error) {
	return storeurl.Open(ctx, p.cfg.Store, storeurl.Options{
		Migrate: p.cfg.Migrate, Clock: p.cfg.StoreClock, Cache: p.cfg.Cache, Logger: p.cfg.Logger,
		Conns: p.cfg.StoreConns, Batches: p.cfg.StoreBatches, TenantCap: p.cfg.TenantMaxActive > 0 || p.cfg.StoreMaxActive > 0,
		ReplayCache: p.cfg.StoreReplayCache, ListenURL: p.cfg.StoreListen, Partitions: p.cfg.StorePartitions,
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
	keyed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hw := heldFlushes{ResponseWriter: w}
		if h := w.Header(); len(h) > 0 {
			hw.set = h.Clone()
		}
		p.rp.ServeHTTP(hw, r)
	})
	g := &guarded{main: e.Middleware(keyed), routes: make([]http.Handler, len(engines))}
	if ae != nil {
		g.async = ae.Middleware(keyed)
	}
	for i, re := range engines {
		if re != nil {
			g.routes[i] = re.Middleware(keyed)
		}
	}
	p.guarded.Store(g)
	return nil
}

// heldFlushes is the writer the reverse proxy gets under a key. The
// reverse proxy flushes after every write when the upstream's answer has
// no length (chunked, or HTTP/2 without content-length), and under a key a
// flush makes the engine send the answer as written, before it is stored:
// a client could get an answer its retries never replay. Only an event
// stream's flushes go through; any other answer is sent once stored, or
// as written past the size the engine stores.
type heldFlushes struct {
	http.ResponseWriter
	// set is what the engine put in the header before the upstream was
	// called (the echoed key): the reverse proxy empties the header map
	// after relaying an informational answer (100 Continue, 103 Early
	// Hints), and the final answer must still carry it.
	set http.Header
}

func (w heldFlushes) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		h := w.Header()
		for k, v := range w.set {
			if _, ok := h[k]; !ok {
				h[k] = v
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w heldFlushes) FlushError() error {
	if httpfield.IsEventStream(w.Header()) {
		return http.NewResponseController(w.ResponseWriter).Flush()
	}
	return nil
}

func (w heldFlushes) Unwrap() http.ResponseWriter { return w.ResponseWriter }

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

// Addr returns the proxy's bound address.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

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
	stopOpening, err := p.startBackground(ctx)
	if err != nil {
		return err
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
	errs := p.stopServers(sctx, errc, running)
	if p.opening != nil {
		// The opener must not attach a store after the close below.
		stopOpening()
		<-p.opening
	}
	p.transport.CloseIdleConnections()
	errs = append(errs, p.stopBackground(sctx)...)
	if failed != nil && !errors.Is(failed, http.ErrServerClosed) {
		errs = append(errs, failed)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	p.log.Info("idem proxy stopped")
	return nil
}

// startBackground starts the background services and the asynchronous
// worker when the store is open, else the opener that starts them once it
// opens; stopOpening stops the opener.
func (p *Proxy) startBackground(ctx context.Context) (stopOpening func(), err error) {
	if p.Store() == nil {
		octx, stop := context.WithCancel(ctx)
		p.opening = make(chan struct{})
		go p.openLoop(octx, ctx)
		return stop, nil
	}
	if err := p.startMaintenance(ctx); err != nil {
		return func() {}, err
	}
	if err := p.startWorker(ctx); err != nil {
		return func() {}, err
	}
	return func() {}, nil
}

// stopServers shuts the servers down by ctx's deadline and waits for the
// running ones to return on errc.
func (p *Proxy) stopServers(ctx context.Context, errc <-chan error, running int) []error {
	var errs []error
	if err := p.server.Shutdown(ctx); err != nil {
		// Past the deadline the clients are cut off and the store closes
		// under the requests still running: as after a crash, their keys
		// stay in progress until the lease expires, then become unknown.
		errs = append(errs, fmt.Errorf("proxy: shutdown: %w", err), p.server.Close())
	}
	if p.admin != nil {
		if err := p.admin.Shutdown(ctx); err != nil {
			errs = append(errs, p.admin.Close())
		}
	}
	for ; running > 0; running-- {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	return errs
}

// stopBackground stops the worker, the background services, the metrics
// and the traces, and closes the store last.
func (p *Proxy) stopBackground(ctx context.Context) []error {
	var errs []error
	if err := p.stopWorker(ctx); err != nil {
		errs = append(errs, fmt.Errorf("proxy: asynchronous worker: %w", err))
	}
	p.mu.Lock()
	maint, st := p.maint, p.store
	p.mu.Unlock()
	if maint != nil {
		if err := maint.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("proxy: background services: %w", err))
		}
	}
	if p.durabilityGauges != nil {
		p.durabilityGauges.Unregister()
	}
	if p.lostGauge != nil {
		p.lostGauge.Unregister()
	}
	if p.metrics != nil {
		if err := p.metrics.shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("proxy: metrics: %w", err))
		}
	}
	if err := p.tracing.shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("proxy: traces: %w", err))
	}
	if st != nil {
		if err := st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("proxy: close store: %w", err))
		}
	}
	return errs
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
	stop, _ := paceCollector(cfg.GCHeadroom, os.Getenv)
	defer stop()
	return p.Serve(ctx)
}

// paceCollector starts the heap floor of --gc-headroom, unless it is 0 or
// the environment sets GOGC: the operator's choice of pace stands. It
// returns what undoes it, and whether it started one.
func paceCollector(headroom int64, getenv func(string) string) (stop func(), started bool) {
	if headroom <= 0 || getenv("GOGC") != "" {
		return func() {}, false
	}
	return heapfloor.Start(uint64(headroom)).Stop, true
}
