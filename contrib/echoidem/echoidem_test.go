package echoidem_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/echoidem"
	"github.com/idem-go/idem/internal/testkit/adaptertest"
	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
)

// app is an ordinary echo application: recovery outermost, the
// middleware on a group and on the rest, handlers in echo's own idioms
// (errors returned, not written).
func app(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
	ec := echo.New()
	ec.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true}))
	mw := echoidem.Middleware(e)

	d := ec.Group("/d", mw)
	d.POST("/charges", func(c *echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]any{"op": "charge", "n": h.Count("/d/charges")})
	})
	d.POST("/refunds", func(c *echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]any{"op": "refund", "n": h.Count("/d/refunds")})
	})

	p := ec.Group("", mw)
	p.POST("/orders/:id", func(c *echo.Context) error {
		return c.JSON(http.StatusOK, map[string]any{"order": c.Param("id"), "n": h.Count("/orders/{id}")})
	})
	p.POST("/fail/:status", func(c *echo.Context) error {
		n := h.Count("/fail/{status}")
		status, _ := strconv.Atoi(c.Param("status"))
		return echo.NewHTTPError(status, "refused "+strconv.Itoa(n))
	})
	p.POST("/panic", func(c *echo.Context) error {
		h.Count("/panic")
		panic("boom")
	})
	p.POST("/slow", func(c *echo.Context) error {
		n := h.Count("/slow")
		h.Block()
		return c.JSON(http.StatusOK, map[string]any{"op": "slow", "n": n})
	})
	p.POST("/nocontent", func(c *echo.Context) error {
		h.Count("/nocontent")
		return c.NoContent(http.StatusNoContent)
	})
	return ec
}

func TestAdapter(t *testing.T) { adaptertest.Run(t, app) }

// The application's own error handler renders a handler's error once,
// inside the protocol; a replay does not call it.
func TestErrorHandlerRendersOnce(t *testing.T) {
	calls := 0
	app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
		ec := echo.New()
		ec.HTTPErrorHandler = func(c *echo.Context, err error) {
			calls++
			c.JSON(http.StatusConflict, map[string]any{"error": err.Error()})
		}
		ec.Use(echoidem.Middleware(e))
		ec.POST("/d/charges", func(c *echo.Context) error {
			h.Count("/d/charges")
			return errors.New("card declined")
		})
		return ec
	})
	first := app.Post(t, "/d/charges", "k", `{}`)
	again := app.Post(t, "/d/charges", "k", `{}`)
	if first.Status != http.StatusConflict || string(first.Body) != "{\"error\":\"card declined\"}\n" {
		t.Fatalf("first: %d %q", first.Status, first.Body)
	}
	if again.Status != http.StatusConflict || !again.Replayed() || string(again.Body) != string(first.Body) {
		t.Fatalf("retry: %d replayed=%v %q", again.Status, again.Replayed(), again.Body)
	}
	if calls != 1 || app.Hooks.Runs("/d/charges") != 1 {
		t.Fatalf("error handler calls %d, handler runs %d; want 1 and 1", calls, app.Hooks.Runs("/d/charges"))
	}
}

// A POST to a route that echo serves for other methods only: echo answers
// 405 with the route's path in c.Path(), and the middleware passes it
// through untouched (no key demanded, nothing stored under one).
func TestMethodNotAllowedPassesThrough(t *testing.T) {
	app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
		ec := echo.New()
		ec.Use(echoidem.Middleware(e))
		ec.PUT("/items/:id", func(c *echo.Context) error { return c.NoContent(http.StatusNoContent) })
		return ec
	})
	nokey := app.Post(t, "/items/1", "", `{}`)
	keyed := app.Post(t, "/items/1", "k", `{}`)
	again := app.Post(t, "/items/1", "k", `{}`)
	if nokey.Status != http.StatusMethodNotAllowed || keyed.Status != http.StatusMethodNotAllowed || again.Replayed() {
		t.Fatalf("no key: %d; keyed: %d; again: %d (replayed %v)", nokey.Status, keyed.Status, again.Status, again.Replayed())
	}
}

// A POST to a path under a group that no route of the group serves: echo
// serves it with the 404 route the group registers for its middleware
// (c.Path() "/d/*"), and the application's own RouteNotFound routes
// likewise. The middleware passes them through untouched: echo's 404
// without a key, and with one, nothing stored under it.
func TestNotFoundRoutesPassThrough(t *testing.T) {
	app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
		ec := echo.New()
		d := ec.Group("/d", echoidem.Middleware(e))
		d.POST("/charges", func(c *echo.Context) error { return c.NoContent(http.StatusCreated) })
		x := ec.Group("/x")
		x.Use(echoidem.Middleware(e))
		x.RouteNotFound("/*", func(c *echo.Context) error { return c.String(http.StatusNotFound, "no such thing") })
		return ec
	})
	for _, path := range []string{"/d/nowhere", "/d", "/x/nowhere"} {
		nokey := app.Post(t, path, "", `{}`)
		keyed := app.Post(t, path, "k", `{}`)
		again := app.Post(t, path, "k", `{}`)
		if nokey.Status != http.StatusNotFound || keyed.Status != http.StatusNotFound || again.Status != http.StatusNotFound || again.Replayed() {
			t.Fatalf("POST %s: no key %d %s; keyed %d; again %d (replayed %v); want 404s, none replayed",
				path, nokey.Status, nokey.Body, keyed.Status, again.Status, again.Replayed())
		}
	}
}
