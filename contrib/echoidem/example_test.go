package echoidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/echoidem"
	"github.com/idem-go/idem/store/memory"
	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
)

func ExampleMiddleware() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	e := echo.New()
	e.Use(middleware.Recover()) // before the middleware: it answers a panic
	e.Use(echoidem.Middleware(engine))
	refunds := 0
	e.POST("/v1/charges/:id/refund", func(c *echo.Context) error {
		refunds++
		if c.Param("id") == "ch_gone" {
			// Rendered inside the protocol: this 404 is stored and replayed.
			return echo.NewHTTPError(http.StatusNotFound, "no such charge")
		}
		return c.JSON(http.StatusCreated, map[string]any{"refunded": c.Param("id")})
	})

	for i := 0; i < 2; i++ {
		req := httptest.NewRequest("POST", "/v1/charges/ch_gone/refund", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "refund-ch_gone")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Printf("%d %s replayed=%q\n", w.Code, strings.TrimSpace(w.Body.String()), w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("refund handler runs:", refunds)
	// Output:
	// 404 {"message":"no such charge"} replayed=""
	// 404 {"message":"no such charge"} replayed="true"
	// refund handler runs: 1
}
