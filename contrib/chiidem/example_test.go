package chiidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/chiidem"
	"github.com/idem-go/idem/store/memory"
)

func ExampleMiddleware() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer) // before the middleware: it answers a panic
	r.Route("/v1", func(r chi.Router) {
		// Use inside a subrouter: each route below still has its own records.
		r.Use(chiidem.Middleware(engine))
		r.Post("/charges", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"op":"charge"}`)
		})
		r.Post("/refunds", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"op":"refund"}`)
		})
	})

	for _, path := range []string{"/v1/charges", "/v1/refunds", "/v1/refunds"} {
		req := httptest.NewRequest("POST", path, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k-1") // one key, two routes
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Printf("%s %d %s replayed=%q\n", path, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	// Output:
	// /v1/charges 201 {"op":"charge"} replayed=""
	// /v1/refunds 201 {"op":"refund"} replayed=""
	// /v1/refunds 201 {"op":"refund"} replayed="true"
}

// Without the adapter: engine.Middleware on the route itself, where chi
// has routed and r.Pattern is the route's full pattern.
func Example_with() {
	engine, _ := idem.New(memory.New(memory.Config{}), idem.Config{})
	r := chi.NewRouter()
	r.Route("/v1/orders", func(r chi.Router) {
		r.With(engine.Middleware).Post("/{id}/ship", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "shipped %s", chi.URLParam(r, "id"))
		})
	})
	req := httptest.NewRequest("POST", "/v1/orders/42/ship", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "ship-42")
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	fmt.Println(w.Code, w.Body)
	// Output:
	// 200 shipped 42
}
