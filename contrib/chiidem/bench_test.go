package chiidem_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/chiidem"
	"github.com/idem-go/idem/store/memory"
)

// benchRouter is a router of 50 routes, ten subrouters of five, with mw
// used as at says: "subrouter" (Use inside each subrouter), "root" (Use on
// the root router) or "bare" (not at all).
func benchRouter(mw func(http.Handler) http.Handler, at string) http.Handler {
	ok := func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }
	r := chi.NewRouter()
	if at == "root" {
		r.Use(mw)
	}
	for i := range 10 {
		r.Route("/v1/r"+strconv.Itoa(i), func(r chi.Router) {
			if at == "subrouter" {
				r.Use(mw)
			}
			r.Post("/", ok)
			r.Get("/{id}", ok)
			r.Delete("/{id}", ok)
			r.Post("/{id}/capture", ok)
			r.Post("/{id}/refund", ok)
		})
	}
	return r
}

// BenchmarkMiddleware measures what the middleware adds to a request in a
// router of 50 routes, used inside the subrouters and on the root router,
// against the same router without it (bare): for a route below a
// subrouter (capture: "/v1/r5/{id}/capture") and for a subrouter's "/"
// route, reached through its mount's stub (create: "/v1/r5"). The engine
// protects PATCH only, so the POST requests pass through it: what is left
// is the route lookup.
//
//	go test -run '^$' -bench BenchmarkMiddleware -benchmem -count 5 . | go run ../../internal/tools/benchratio
func BenchmarkMiddleware(b *testing.B) {
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{
		Methods: []string{http.MethodPatch},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, target := range []struct{ name, path string }{
		{"capture", "/v1/r5/ch_1/capture"},
		{"create", "/v1/r5"},
	} {
		for _, at := range []string{"bare", "subrouter", "root"} {
			b.Run(target.name+"/"+at, func(b *testing.B) {
				h := benchRouter(chiidem.Middleware(e), at)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, target.path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("POST %s: %d", target.path, w.Code)
				}
				b.ReportAllocs()
				for b.Loop() {
					h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, target.path, nil))
				}
			})
		}
	}
}
