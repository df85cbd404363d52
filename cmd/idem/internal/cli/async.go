package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
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

// asyncRoutes matches requests against the asynchronous patterns (the
// --async ones and the config file's "async" routes), with the syntax and
// precedence of http.ServeMux patterns ("POST /v1/reports",
// "POST /v1/reports/{id}/export", "POST /v1/batch/"). They are matched
// before the other routes of the config file.
type asyncRoutes struct {
	mux *http.ServeMux
	// routes maps each canonical pattern to its route in the config
	// file's table, or -1 for an --async pattern no route repeats.
	routes map[string]int
}

// newAsyncRoutes checks the --async patterns (each must name a method the
// proxy protects and a path) and adds the asynchronous routes of the
// table, checked by newRouteTable. Nil when there is none.
func newAsyncRoutes(patterns []string, protected map[string]bool, table *routeTable) (r *asyncRoutes, err error) {
	r = &asyncRoutes{mux: http.NewServeMux(), routes: map[string]int{}}
	for _, pat := range patterns {
		method, _, err := asyncPattern(pat)
		if err == nil && !protected[method] {
			err = fmt.Errorf("%s is not a protected method (--methods)", method)
		}
		canon := canonPattern(pat)
		if err == nil {
			err = register(r.mux, canon, asyncMark{})
		}
		if err != nil {
			return nil, fmt.Errorf("proxy: --async %q: %w", pat, err)
		}
		r.routes[canon] = -1
	}
	if table != nil {
		for i := range table.routes {
			rt := &table.routes[i]
			if !rt.Async {
				continue
			}
			canon := canonPattern(rt.Pattern)
			if _, ok := r.routes[canon]; !ok {
				if err := register(r.mux, canon, asyncMark{}); err != nil {
					return nil, fmt.Errorf("proxy: route %q: %w", rt.Pattern, err)
				}
			}
			r.routes[canon] = i
		}
	}
	if len(r.routes) == 0 {
		return nil, nil
	}
	return r, nil
}

// asyncPattern checks an asynchronous pattern: a method and a path, not
// under the status resources.
func asyncPattern(pat string) (method, path string, err error) {
	method, path, ok := strings.Cut(strings.TrimSpace(pat), " ")
	path = strings.TrimSpace(path)
	switch {
	case !ok || method == "" || !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t"):
		return "", "", errors.New("want METHOD /path, e.g. 'POST /v1/reports'")
	case strings.HasPrefix(path, idem.DefaultStatusPath) || path+"/" == idem.DefaultStatusPath:
		return "", "", errors.New("the path is the status resources' own")
	}
	return method, path, nil
}

// splitPatterns splits a comma list of asynchronous patterns (an
// --async value from the environment or a config file's array): a comma
// starts a new pattern only where a method and a path follow it, so a
// comma inside a path stays there.
func splitPatterns(v string) []string {
	var out []string
	for _, part := range strings.Split(v, ",") {
		method, path, ok := strings.Cut(strings.TrimSpace(part), " ")
		if len(out) == 0 || (ok && upperToken(method) && strings.HasPrefix(strings.TrimSpace(path), "/")) {
			out = append(out, part)
			continue
		}
		out[len(out)-1] += "," + part
	}
	return out
}

// canonPattern is pattern with its parts separated by one space, so that
// an --async pattern and a route of the config file written with other
// spacing are found to be the same.
func canonPattern(pattern string) string { return strings.Join(strings.Fields(pattern), " ") }

// registeredAt matches where http.ServeMux says a pattern was registered.
var registeredAt = regexp.MustCompile(` \(registered at [^)]*\)`)

// register adds pattern to mux with h, turning the mux's panic on a bad
// or conflicting pattern into an error.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			// The mux names the source line of each pattern; the user
			// wrote them in flags or a config file, not at that line.
			err = errors.New(registeredAt.ReplaceAllString(fmt.Sprint(p), ""))
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// asyncMark is the handler of every pattern in asyncRoutes' mux: the mux
// answers a request it would redirect with a handler of its own.
type asyncMark struct{}

func (asyncMark) ServeHTTP(http.ResponseWriter, *http.Request) {}

// match reports whether r is on an asynchronous route, and which route of
// the config file's table it is (-1: an --async pattern of no route). As
// for the other routes (routeTable.match), a request whose path the mux
// would redirect (not clean, or missing a trailing slash), or that hides a
// dot-segment from it, matches none: the upstream may not read its path as
// the mux does.
func (a *asyncRoutes) match(r *http.Request) (int, bool) {
	if a == nil || hasDotSegment(r.URL.Path) {
		return 0, false
	}
	h, pattern := a.mux.Handler(r)
	if _, ok := h.(asyncMark); !ok {
		return 0, false
	}
	i, ok := a.routes[pattern]
	return i, ok
}

// asyncEngineConfig is the engine configuration of the asynchronous
// routes, reporting to obs.
func (cfg ProxyConfig) asyncEngineConfig(obs idem.Observer) idem.Config {
	c := cfg.engineConfig(obs)
	c.Async = true
	c.AsyncWait = cfg.AsyncWait
	c.AsyncKeepHeaders = cfg.AsyncKeepHeaders
	// The credentials a tenant is taken from are not stored either
	// (Authorization and Cookie never are), unless named to be kept.
	// Sources that do not parse are refused by proxyTenants.
	if sources, err := parseTenantSources(cfg.TenantFrom); err == nil {
		c.AsyncDropHeaders = (&tenants{sources: sources}).credentialHeaders()
	}
	c.AsyncQueue = asyncQueue
	return c
}

// asyncQueue is the queue of the proxy's asynchronous requests: proxies
// sharing a store serve one upstream, and any of them may run any request.
const asyncQueue = "proxy"

// attachAsync derives the asynchronous engine and its worker from the
// synchronous engine; nil without asynchronous routes.
func (p *Proxy) attachAsync(e *idem.Engine) (*idem.Engine, *idem.Worker, error) {
	if p.async == nil {
		return nil, nil, nil
	}
	if _, why := store.AsQueue(e.Store()); why != "" {
		return nil, nil, fmt.Errorf("proxy: asynchronous routes need a store that keeps pending requests: %s", why)
	}
	ae, err := idem.New(e.Store(), p.cfg.asyncEngineConfig(p.obs))
	if err != nil {
		return nil, nil, err
	}
	var w *idem.Worker
	if p.cfg.AsyncWorkers > 0 {
		w, err = ae.NewWorker(idem.WorkerConfig{Handler: p.rp, Queue: asyncQueue, Concurrency: p.cfg.AsyncWorkers, Poll: p.cfg.AsyncPoll})
		if err != nil {
			return nil, nil, err
		}
	}
	return ae, w, nil
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
	if !p.asyncStatusID(strings.TrimPrefix(r.URL.Path, idem.DefaultStatusPath)) {
		// A synchronous route's record is no one's status resource: its
		// answer is replayed only to a retry whose body matches. Answered
		// as an id that names no request.
		u := *r.URL
		u.Path, u.RawPath = idem.DefaultStatusPath, ""
		r.URL = &u
	}
	ae.StatusHandler().ServeHTTP(w, r)
	return true
}

// asyncStatusID reports whether a status resource's id names a request of
// an asynchronous route.
func (p *Proxy) asyncStatusID(id string) bool {
	method, route, _, ok := idem.ParseStatusID(id)
	if !ok || !strings.HasPrefix(route, "/") {
		return false
	}
	u, err := url.ParseRequestURI(route)
	if err != nil {
		return false
	}
	_, async := p.async.match(&http.Request{Method: method, URL: u, Host: "idem.invalid"})
	return async
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
