// Package echoidem puts idem's idempotency-key protocol in front of echo
// (v5) routes.
//
//	e := echo.New()
//	e.Use(middleware.Recover())
//	e.Use(echoidem.Middleware(engine))
//	e.POST("/v1/charges/:id/capture", capture)
//
// The route of a request is its echo pattern (c.Path(), "/v1/charges/:id/capture"),
// so every route has records of its own, in groups as at the top level.
//
// A handler that returns an error has it rendered by the application's
// HTTPErrorHandler inside the protocol, so the error's answer is the one
// recorded: a 4xx is stored and replayed, a 5xx releases the key so a retry
// runs the handler again (the engine's response policy). The middleware
// then returns nil: the answer is written, and echo must not write it a
// second time. Middleware outside this one therefore sees nil for such a
// request; to log handler errors, log them in the HTTPErrorHandler or in a
// middleware placed after this one.
//
// Order: put middleware.Recover() before this middleware. A panicking
// handler leaves its record "outcome unknown" (a retry gets 409, never a
// second execution); the panic goes on up to the recovery, which answers
// the client.
package echoidem

import (
	"net/http"

	"github.com/idem-go/idem"
	"github.com/labstack/echo/v5"
)

// Middleware returns echo middleware that serves each request through e,
// with c.Path() as its route. Requests that matched no route (404, 405)
// and methods e does not protect pass through untouched, their errors
// returned to echo as usual.
func Middleware(e *idem.Engine) echo.MiddlewareFunc {
	if e == nil {
		panic("echoidem: Middleware needs an engine")
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			route := c.Path()
			if ri := c.RouteInfo(); route == "" || ri.Method == echo.RouteNotFound ||
				ri.Name == echo.NotFoundRouteName || ri.Name == echo.MethodNotAllowedRouteName {
				// No route matched (echo names the path of a partial match
				// on a 404 or 405, and a group's or the application's
				// RouteNotFound route serves a 404 under its own path):
				// there is nothing to protect, and a key must not be spent
				// on the 404 or 405.
				return next(c)
			}
			origReq, origRes := c.Request(), c.Response()
			var passErr error
			e.Handle(origRes, origReq, route, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Restored on the way out, a panic's included: the recovery
				// must answer on the client's writer, not into the recorder.
				defer func() { c.SetRequest(origReq); c.SetResponse(origRes) }()
				c.SetRequest(r)
				if idem.FromContext(r.Context()) == nil {
					// Passed through (not an execution under a key): the
					// error goes to echo as usual.
					passErr = next(c)
					return
				}
				// A fresh echo.Response over the recorder: the error handler
				// sees an uncommitted answer and renders the error into it.
				c.SetResponse(echo.NewResponse(w, c.Logger()))
				if err := next(c); err != nil {
					errorHandler(c)(c, err)
				}
			}))
			return passErr
		}
	}
}

// errorHandler is the application's error handler, or echo's default for
// a context made without an Echo (as tests do).
func errorHandler(c *echo.Context) echo.HTTPErrorHandler {
	if e := c.Echo(); e != nil && e.HTTPErrorHandler != nil {
		return e.HTTPErrorHandler
	}
	return echo.DefaultHTTPErrorHandler(false)
}
