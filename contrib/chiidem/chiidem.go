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
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/idem-go/idem"
)

// Middleware returns chi middleware that serves each request through e,
// with the full pattern of the route chi will serve it with as its route.
// Requests that match no route (404, 405) and methods e does not protect
// pass through untouched. Outside a chi router (no routing context), it
// is engine.Middleware.
func Middleware(e *idem.Engine) func(http.Handler) http.Handler {
	if e == nil {
		panic("chiidem: Middleware needs an engine")
	}
	return func(next http.Handler) http.Handler {
		plain := e.Middleware(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rctx := chi.RouteContext(r.Context())
			if rctx == nil || rctx.Routes == nil {
				plain.ServeHTTP(w, r)
				return
			}
			route := Route(rctx.Routes, r)
			if route == "" {
				next.ServeHTTP(w, r) // chi answers 404 or 405
				return
			}
			e.Handle(w, r, route, next)
		})
	}
}

// Route returns the full pattern of the route root serves r with
// ("/d/{id}/capture", across mounted subrouters), or "" when no route
// matches r's method and path.
//
// The lookup is chi's own, on the path chi routes: the routing context's
// RoutePath when a middleware rewrote it (StripSlashes, CleanPath,
// URLFormat) or a mount set it, below the subrouters already matched;
// else the request's path.
func Route(root chi.Routes, r *http.Request) string {
	method := r.Method
	routes, prefix, path := root, "", ""
	if rctx := chi.RouteContext(r.Context()); rctx != nil {
		if rctx.RouteMethod != "" {
			method = rctx.RouteMethod // a middleware rerouted the method (GetHead)
		}
		path = rctx.RoutePath
		for _, pattern := range rctx.RoutePatterns {
			sub := mounted(routes, pattern)
			if sub == nil {
				break
			}
			routes, prefix = sub, prefix+strings.TrimSuffix(pattern, "/*")
		}
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
	if found := routes.Find(chi.NewRouteContext(), method, path); found != "" {
		return prefix + found
	}
	return ""
}

// mounted returns the subrouter mounted on routes at pattern ("/d/*"),
// nil when pattern is not a mount.
func mounted(routes chi.Routes, pattern string) chi.Routes {
	for _, rt := range routes.Routes() {
		if rt.Pattern == pattern && rt.SubRoutes != nil {
			return rt.SubRoutes
		}
	}
	return nil
}
