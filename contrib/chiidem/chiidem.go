// Package chiidem puts idem's idempotency-key protocol in front of chi
// routes, wherever the middleware is mounted: with Use on the root router
// or inside a subrouter, with Group, or with With on one route.
//
//	r := chi.NewRouter()
//	r.Use(middleware.Recoverer)
//	r.Route("/v1/charges", func(r chi.Router) {
//		r.Use(chiidem.Middleware(engine))
//		r.Post("/", create)
//		r.Post("/{id}/capture", capture)
//	})
//
// The route of a request is the full chi pattern of the route that will
// serve it ("/v1/charges/{id}/capture"), so every route has records of its
// own.
//
// Why an adapter: chi runs a router's Use middleware before that router
// has chosen a route. At the root, r.Pattern is still empty; inside a
// subrouter mounted at "/d" it is "/d/*" for every route below it, so
// engine.Middleware there would put all of them in one scope. This
// middleware asks the root router which route the request will reach (the
// same lookup chi is about to make, run on a routing context of its own)
// and uses that route's pattern.
//
// Without this module, engine.Middleware is right when it runs after
// routing, on the route itself: r.With(engine.Middleware).Post(...).
//
// Order: put middleware.Recoverer before this middleware. A panicking
// handler leaves its record "outcome unknown" (a retry gets 409, never a
// second execution); the panic goes on up to the recoverer, which answers
// the client.
package chiidem

import (
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"github.com/idem-go/idem"
)

// Middleware returns chi middleware that serves each request through e,
// with the full pattern of the route chi will serve it with as its route.
// Requests that match no route (404, 405) and methods e does not protect
// pass through untouched. Outside a chi router (no routing context), it
// is engine.Middleware.
//
// Finding the route costs a few of chi's tree lookups. A request to a
// mount's own path ("/v1/charges", served by the subrouter's "/" route)
// costs more when the middleware is above that mount: the router that
// holds the mount lists its routes (see atMount). Used inside that
// subrouter, the middleware has no such cost.
func Middleware(e *idem.Engine) func(http.Handler) http.Handler {
	if e == nil {
		panic("chiidem: Middleware needs an engine")
	}
	return func(next http.Handler) http.Handler {
		plain := e.Middleware(next)
		seen := new(places)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rctx := chi.RouteContext(r.Context())
			if rctx == nil || rctx.Routes == nil {
				plain.ServeHTTP(w, r)
				return
			}
			route := lookup(rctx.Routes, r, seen)
			if route == "" {
				next.ServeHTTP(w, r) // chi answers 404 or 405
				return
			}
			e.Handle(w, r, route, next)
		})
	}
}

// Route returns the full pattern of the route root serves r with
// ("/d/{id}/capture", across mounted subrouters, as chi.Walk names it), or
// "" when no route matches r's method and path.
//
// The lookup is chi's own, on the path chi routes: the routing context's
// RoutePath when a middleware rewrote it (StripSlashes, CleanPath,
// URLFormat) or a mount set it, below the subrouters already matched;
// else the request's path. Middleware of With or Group around a mount runs
// once the router has matched the mount, before the mount hands the
// request on: the lookup is then that router's. A subrouter mounted at
// "/d" also serves "/d" and "/d/", with its "/" route, through stubs that
// chi's Find reports as routes of their own: the lookup goes on into the
// subrouter there.
//
// Route finds the subrouters below the patterns chi has matched in the
// routers' lists of routes, which chi builds by walking their trees, on
// every call; the middleware keeps what it found (see places).
func Route(root chi.Routes, r *http.Request) string {
	return lookup(root, r, nil)
}

// lookup is Route, with the subrouters below the patterns matched taken
// from seen when seen is not nil.
func lookup(root chi.Routes, r *http.Request, seen *places) string {
	method := r.Method
	routes, prefix, path := root, "", ""
	if rctx := chi.RouteContext(r.Context()); rctx != nil {
		if rctx.RouteMethod != "" {
			method = rctx.RouteMethod // a middleware rerouted the method (GetHead)
		}
		path = rctx.RoutePath
		patterns := rctx.RoutePatterns
		if n := len(patterns); n > 0 && !handedOn(rctx, r, patterns[n-1]) {
			// Middleware of With or Group, run by the router that matched
			// the last pattern on path: the lookup is that router's again.
			patterns = patterns[:n-1]
		}
		routes, prefix = seen.below(root, method, patterns)
	}
	if path == "" {
		path = r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		if path == "" {
			path = "/"
		}
	}
	rctx := chi.NewRouteContext()
	found := routes.Find(rctx, method, path)
	if found == "" {
		return ""
	}
	if atMount(routes, method, path, rctx.RoutePatterns) {
		if sub, at, stub := below(routes, method, rctx.RoutePatterns); stub {
			// A mount's stub: chi serves it with the subrouter's "/".
			if found = sub.Find(chi.NewRouteContext(), method, "/"); found == "" {
				return ""
			}
			prefix += at
		}
	}
	return prefix + found
}

// handedOn reports whether chi has handed r on to the subrouter mounted at
// pattern, the last pattern matched: true in that subrouter (its Use
// middleware), false in middleware of With or Group around the mount,
// which the router that matched pattern runs before the mount's handler.
// That handler sets RoutePath to "/" and the rest of the path (for "/d/*"
// the "*" URL parameter, for the stubs "/d" and "/d/" nothing), and clears
// the "*" parameter in the routing context, not in r's path values. Where
// the rest is empty and the router's path is "/" too, both readings give
// the same route. For a pattern that is no mount the answer does not
// matter: below stops there.
func handedOn(rctx *chi.Context, r *http.Request, pattern string) bool {
	if strings.HasSuffix(pattern, "*") {
		if n := len(rctx.URLParams.Keys) - 1; n >= 0 && rctx.URLParams.Keys[n] == "*" &&
			n < len(rctx.URLParams.Values) && rctx.URLParams.Values[n] != "" {
			return false
		}
		if r.PathValue("*") != "" {
			return true
		}
	}
	return rctx.RoutePath == "/"
}

// atMount reports whether the last of patterns, the patterns Find matched
// for path one router after another, may be a mount's stub: whether the
// path with an empty segment added ("/d//" for "/d" and "/d/") reaches, in
// that router, a mount there or a route that takes it first ("/d/{id}/",
// "/d/{id}/*"). A route one segment longer ("/d/{id}") does not take it:
// its parameter matches the empty segment, and a "/" is left. It costs one
// lookup; telling a stub for sure (below) walks the routers' trees, which
// only a request that passes this test pays for, and pays every time: a
// route added later on the stub's path takes that path from the stub for
// its method, and only the list of routes tells the two apart (Find names
// both with the stub's pattern).
func atMount(routes chi.Routes, method, path string, patterns []string) bool {
	n := len(patterns)
	stub := strings.TrimSuffix(patterns[n-1], "/")
	if stub == "" {
		return false // Mount("/") sets no stubs
	}
	probe := chi.NewRouteContext()
	routes.Find(probe, method, strings.TrimSuffix(path, "/")+"//")
	got := probe.RoutePatterns
	switch {
	case len(got) < n-1 || !slices.Equal(got[:n-1], patterns[:n-1]):
		return true // the probe went another way above that router
	case len(got) == n-1:
		return false // nothing there takes it: a mount would
	}
	// Below a static stub, the probe stays below it; a stub with parameters
	// may lose it to a static route elsewhere ("/a/x/*" for "/{acct}/x").
	return strings.HasPrefix(got[n-1], stub+"/") || strings.Contains(stub, "{")
}

// below follows patterns, the patterns matched by one router after
// another, from routes down through the subrouters they mount, and returns
// the last router reached and its prefix ("/d/{acct}/x"). all reports that
// every pattern led to a subrouter: for the patterns of a route found, the
// last one is then a stub, and the route is that subrouter's "/".
func below(routes chi.Routes, method string, patterns []string) (last chi.Routes, prefix string, all bool) {
	for _, pattern := range patterns {
		s, at := mounted(routes, method, pattern)
		if s == nil {
			return routes, prefix, false
		}
		routes, prefix = s, prefix+at
	}
	return routes, prefix, len(patterns) > 0
}

// mounted returns the subrouter mounted on routes at pattern, and its
// prefix ("/d"), or nil when pattern is not a mount: "/d/*", or one of the
// stubs "/d" and "/d/" by which Mount routes those paths to the
// subrouter's "/", unless a route of routes serves method there itself
// (chi lists no stub among its routes).
func mounted(routes chi.Routes, method, pattern string) (chi.Routes, string) {
	prefix := strings.TrimSuffix(strings.TrimSuffix(pattern, "*"), "/")
	var sub chi.Routes
	for _, rt := range routes.Routes() {
		switch {
		case rt.Pattern == prefix+"/*" && rt.SubRoutes != nil:
			sub = rt.SubRoutes
		case rt.Pattern == pattern && (rt.Handlers[method] != nil || rt.Handlers["*"] != nil):
			return nil, "" // a route of its own on a stub's path
		}
	}
	return sub, prefix
}

// places keeps, for one handler of the middleware, what below found for
// the routing states the handler has seen (root, method and the patterns
// chi matched): the router the lookup goes on in, and its prefix.
//
// chi makes a handler of the middleware for each place it is put (the Use
// stack of a router, each route of a With or a Group), and what below
// finds for a request follows from the handlers chi ran to bring it there.
// So it holds for every request that reaches the same handler in the same
// state, routes added since or not: a route added on a mount's stub path
// takes the stub's requests for its method to a handler of its own, and
// so does a router mounted over another one (chi's Mount refuses a pattern
// already mounted, but not always one with regexp parameters). Kept for
// all the handlers together, the answer found at one place would be given
// at another.
type places struct {
	mu sync.RWMutex
	m  map[placeKey]place
}

type placeKey struct {
	root     *chi.Mux
	method   string
	patterns string // joined with NUL
}

type place struct {
	routes chi.Routes
	prefix string
}

// below is below, kept in s for a root that chi made (a *chi.Mux); a nil s
// keeps nothing.
func (s *places) below(root chi.Routes, method string, patterns []string) (chi.Routes, string) {
	mux, ok := root.(*chi.Mux)
	if s == nil || !ok || len(patterns) == 0 {
		routes, prefix, _ := below(root, method, patterns)
		return routes, prefix
	}
	k := placeKey{mux, method, strings.Join(patterns, "\x00")}
	s.mu.RLock()
	p, ok := s.m[k]
	s.mu.RUnlock()
	if !ok {
		p.routes, p.prefix, _ = below(root, method, patterns)
		s.mu.Lock()
		if s.m == nil {
			s.m = make(map[placeKey]place)
		}
		s.m[k] = p
		s.mu.Unlock()
	}
	return p.routes, p.prefix
}
