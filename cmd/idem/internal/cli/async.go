package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// Asynchronous routes of the proxy (--async 'POST /v1/reports'). A keyed
// request on such a route is recorded as pending with what the upstream
// needs and answered 202 at once; the proxy's worker claims it (exactly
// one worker among all the proxies sharing the store), forwards it to the
// upstream, and stores the upstream's answer, which retries and the status
// resource then replay.

// asyncRoutes matches requests against the --async patterns, with the
// syntax and precedence of http.ServeMux patterns ("POST /v1/reports",
// "POST /v1/reports/{id}/export", "POST /v1/batch/").
type asyncRoutes struct {
	mux      *http.ServeMux
	patterns map[string]bool
}

// newAsyncRoutes checks the patterns: each must name a method the proxy
// protects and a path.
func newAsyncRoutes(patterns []string, protected map[string]bool) (r *asyncRoutes, err error) {
	if len(patterns) == 0 {
		return nil, nil
	}
	r = &asyncRoutes{mux: http.NewServeMux(), patterns: map[string]bool{}}
	for _, pat := range patterns {
		method, path, ok := strings.Cut(strings.TrimSpace(pat), " ")
		path = strings.TrimSpace(path)
		switch {
		case !ok || method == "" || !strings.HasPrefix(path, "/"):
			return nil, fmt.Errorf("proxy: --async %q: want METHOD /path, e.g. 'POST /v1/reports'", pat)
		case !protected[method]:
			return nil, fmt.Errorf("proxy: --async %q: %s is not a protected method (--methods)", pat, method)
		case strings.HasPrefix(path, idem.DefaultStatusPath) || path+"/" == idem.DefaultStatusPath:
			return nil, fmt.Errorf("proxy: --async %q: the path is the status resources' own", pat)
		}
		canon := method + " " + path
		if err := register(r.mux, canon); err != nil {
			return nil, fmt.Errorf("proxy: --async %q: %w", pat, err)
		}
		r.patterns[canon] = true
	}
	return r, nil
}

// register adds a pattern to mux, turning its panic on a bad or
// conflicting pattern into an error.
func register(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return nil
}

// match reports whether r is on an asynchronous route.
func (a *asyncRoutes) match(r *http.Request) bool {
	if a == nil {
		return false
	}
	_, pattern := a.mux.Handler(r)
	return a.patterns[pattern]
}

// asyncEngineConfig is the engine configuration of the asynchronous
// routes.
func (p *Proxy) asyncEngineConfig() idem.Config {
	cfg := p.engineConfig()
	cfg.Async = true
	cfg.AsyncWait = p.cfg.AsyncWait
	cfg.AsyncKeepHeaders = p.cfg.AsyncKeepHeaders
	cfg.AsyncQueue = asyncQueue
	return cfg
}

// asyncQueue is the queue of the proxy's asynchronous requests: proxies
// sharing a store serve one upstream, and any of them may run any request.
const asyncQueue = "proxy"

// attachAsync derives the asynchronous engine and its worker from the
// synchronous engine, and returns the handler that routes between them.
func (p *Proxy) attachAsync(e *idem.Engine, sync http.Handler) (http.Handler, *idem.Engine, *idem.Worker, error) {
	if p.async == nil {
		return sync, nil, nil, nil
	}
	if _, ok := e.Store().(store.Queue); !ok {
		return nil, nil, nil, errors.New("proxy: --async needs a store that keeps pending requests")
	}
	ae, err := idem.New(e.Store(), p.asyncEngineConfig())
	if err != nil {
		return nil, nil, nil, err
	}
	var w *idem.Worker
	if p.cfg.AsyncWorkers > 0 {
		w, err = ae.NewWorker(idem.WorkerConfig{Handler: p.rp, Queue: asyncQueue, Concurrency: p.cfg.AsyncWorkers, Poll: p.cfg.AsyncPoll})
		if err != nil {
			return nil, nil, nil, err
		}
	}
	async := ae.Middleware(p.rp)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.async.match(r) {
			async.ServeHTTP(w, r)
			return
		}
		sync.ServeHTTP(w, r)
	})
	return h, ae, w, nil
}

// serveStatus answers a read of a status resource (GET or HEAD under
// idem.DefaultStatusPath) when asynchronous routes are on: the caller's
// tenant is named as for a keyed request, and only its own requests are
// found. It reports whether it answered.
func (p *Proxy) serveStatus(w http.ResponseWriter, r *http.Request) bool {
	if p.async == nil || (r.Method != http.MethodGet && r.Method != http.MethodHead) ||
		!strings.HasPrefix(r.URL.Path, idem.DefaultStatusPath) {
		return false
	}
	tenant, err := p.tenants.tenant(r)
	switch {
	case errors.Is(err, errNoTenant):
		p.refuse(w, r, probTenantMissing, "send one of: "+p.tenants.String())
		return true
	case err != nil:
		p.refuse(w, r, probTenantInvalid, err.Error())
		return true
	}
	p.mu.Lock()
	ae := p.asyncEngine
	p.mu.Unlock()
	if ae == nil {
		p.refuse(w, r, probStoreDown, "")
		return true
	}
	r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
	ae.StatusHandler().ServeHTTP(w, r)
	return true
}

// startWorker starts the worker of the asynchronous routes, if any.
func (p *Proxy) startWorker(ctx context.Context) error {
	p.mu.Lock()
	w := p.worker
	p.mu.Unlock()
	if w == nil {
		return nil
	}
	return w.Start(ctx)
}

// stopWorker stops the worker: requests it is running get until ctx ends
// to be recorded.
func (p *Proxy) stopWorker(ctx context.Context) error {
	p.mu.Lock()
	w := p.worker
	p.mu.Unlock()
	if w == nil {
		return nil
	}
	return w.Stop(ctx)
}
