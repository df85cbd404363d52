package chiidem_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/chiidem"
	"github.com/idem-go/idem/internal/testkit/adaptertest"
	"github.com/idem-go/idem/store/memory"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// routes registers the suite's routes on d (the /d group) and p (the
// rest), in chi's idioms.
func routes(h *adaptertest.Hooks, d, p chi.Router) {
	d.Post("/charges", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, map[string]any{"op": "charge", "n": h.Count("/d/charges")})
	})
	d.Post("/refunds", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, map[string]any{"op": "refund", "n": h.Count("/d/refunds")})
	})
	p.Post("/orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"order": chi.URLParam(r, "id"), "n": h.Count("/orders/{id}")})
	})
	p.Post("/fail/{status}", func(w http.ResponseWriter, r *http.Request) {
		n := h.Count("/fail/{status}")
		status, _ := strconv.Atoi(chi.URLParam(r, "status"))
		http.Error(w, "refused "+strconv.Itoa(n), status)
	})
	p.Post("/panic", func(w http.ResponseWriter, r *http.Request) {
		h.Count("/panic")
		panic("boom")
	})
	p.Post("/slow", func(w http.ResponseWriter, r *http.Request) {
		n := h.Count("/slow")
		h.Block()
		writeJSON(w, http.StatusOK, map[string]any{"op": "slow", "n": n})
	})
	p.Post("/nocontent", func(w http.ResponseWriter, r *http.Request) {
		h.Count("/nocontent")
		w.WriteHeader(http.StatusNoContent)
	})
}

// The adapter with Use inside a subrouter: the case engine.Middleware
// cannot serve, since chi has not chosen the route when it runs.
func TestAdapterInSubrouter(t *testing.T) {
	adaptertest.Run(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
		r := chi.NewRouter()
		r.Use(middleware.Recoverer)
		mw := chiidem.Middleware(e)
		r.Route("/d", func(sr chi.Router) {
			sr.Use(mw)
			routes(h, sr, r.With(mw))
		})
		return r
	})
}

// The adapter with Use on the root router, before chi has routed at all.
func TestAdapterAtTheRoot(t *testing.T) {
	adaptertest.Run(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
		r := chi.NewRouter()
		r.Use(middleware.Recoverer)
		r.Use(chiidem.Middleware(e))
		r.Route("/d", func(sr chi.Router) { routes(h, sr, r) })
		return r
	})
}

// Without the adapter: engine.Middleware on each route, where chi has
// routed and r.Pattern is the full pattern.
func TestEngineMiddlewareWithOnRoutes(t *testing.T) {
	adaptertest.Run(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
		r := chi.NewRouter()
		r.Use(middleware.Recoverer)
		r.Route("/d", func(sr chi.Router) {
			routes(h, sr.With(e.Middleware), r.With(e.Middleware))
		})
		return r
	})
}

// engine.Middleware with Use inside a subrouter sees the mount pattern
// "/d/*" for every route below it: one scope for them all. The request
// target in the fingerprint keeps that from replaying one route's answer
// for another: the same key on the other route is refused as reused.
func TestEngineMiddlewareUsedInSubrouterNeverCrossReplays(t *testing.T) {
	app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
		r := chi.NewRouter()
		r.Route("/d", func(sr chi.Router) {
			sr.Use(e.Middleware)
			routes(h, sr, chi.NewRouter())
		})
		return r
	})
	charge := app.Post(t, "/d/charges", "shared", `{"amount":100}`)
	if charge.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", charge.Status, charge.Body)
	}
	refund := app.Post(t, "/d/refunds", "shared", `{"amount":100}`)
	if refund.Status != http.StatusUnprocessableEntity || refund.ProblemType() != "key-reused" {
		t.Fatalf("refund with the charge's key: %d %s; want 422 key-reused", refund.Status, refund.Body)
	}
	if app.Hooks.Runs("/d/refunds") != 0 || app.Hooks.Runs("/d/charges") != 1 {
		t.Fatalf("runs: charges %d refunds %d", app.Hooks.Runs("/d/charges"), app.Hooks.Runs("/d/refunds"))
	}
}

func TestRoute(t *testing.T) {
	r := chi.NewRouter()
	ok := func(http.ResponseWriter, *http.Request) {}
	r.Post("/a/{id}", ok)
	r.Route("/d", func(sr chi.Router) {
		sr.Post("/charges", ok)
		sr.Route("/{acct}/x", func(x chi.Router) {
			x.Post("/", ok)
			x.Post("/{id:[0-9]+}", ok)
		})
	})
	r.Route("/e", func(sr chi.Router) { sr.Post("/x", ok) })
	r.Route("/g", func(sr chi.Router) { sr.Post("/", ok) })
	r.Put("/g", ok) // a route of its own on the stub's path, for PUT
	r.Post("/f", ok)
	r.Post("/f/*", ok) // a wildcard route, not a mount
	r.Route("/h", func(sr chi.Router) { sr.Post("/", ok) })
	r.Post("/h/{id}", ok) // takes "/h/_" from the mount, not "/h" and "/h/"
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/a/7", "/a/{id}"},
		{"POST", "/d/charges", "/d/charges"},
		{"POST", "/d/acct_1/x/42", "/d/{acct}/x/{id:[0-9]+}"},
		{"POST", "/d/acct_1/x/abc", ""},         // the regexp refuses it: 404
		{"POST", "/d/acct_1/x", "/d/{acct}/x/"}, // the subrouter's "/", through the mount's stubs
		{"POST", "/d/acct_1/x/", "/d/{acct}/x/"},
		{"POST", "/e", ""}, // a stub, but the subrouter has no "/": 404
		{"POST", "/e/", ""},
		{"POST", "/g", "/g/"},
		{"PUT", "/g", "/g"},
		{"POST", "/f", "/f"},
		{"POST", "/f/1", "/f/*"},
		{"POST", "/h", "/h/"},
		{"POST", "/h/", "/h/"},
		{"POST", "/h/1", "/h/{id}"},
		{"POST", "/nowhere", ""},
		{"GET", "/a/7", ""}, // 405
	} {
		req, _ := http.NewRequest(tc.method, tc.path, nil)
		if got := chiidem.Route(r, req); got != tc.want {
			t.Errorf("%s %s: route %q; want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

// chi's path-rewriting middleware (StripSlashes here) make chi route on
// the routing context's RoutePath, not the request's path: the route is
// looked up there too, at the root and inside a mounted subrouter, so a
// keyed POST to "/d/charges/" is protected (run once, replayed, a missing
// key refused), not passed through as if it matched no route.
func TestRewrittenPaths(t *testing.T) {
	for name, mount := range map[string]func(r chi.Router, mw func(http.Handler) http.Handler, h http.HandlerFunc){
		"at the root": func(r chi.Router, mw func(http.Handler) http.Handler, h http.HandlerFunc) {
			r.Use(mw)
			r.Post("/d/charges", h)
		},
		"in a subrouter": func(r chi.Router, mw func(http.Handler) http.Handler, h http.HandlerFunc) {
			r.Route("/d", func(r chi.Router) {
				r.Use(mw)
				r.Post("/charges", h)
			})
		},
	} {
		t.Run(name, func(t *testing.T) {
			app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
				r := chi.NewRouter()
				r.Use(middleware.StripSlashes)
				mount(r, chiidem.Middleware(e), func(w http.ResponseWriter, r *http.Request) {
					writeJSON(w, http.StatusCreated, map[string]any{"op": "charge", "n": h.Count("/d/charges")})
				})
				return r
			})
			first := app.Post(t, "/d/charges/", "k", `{}`)
			again := app.Post(t, "/d/charges/", "k", `{}`)
			nokey := app.Post(t, "/d/charges/", "", `{}`)
			if n := app.Hooks.Runs("/d/charges"); n != 1 || first.Status != http.StatusCreated || !again.Replayed() || nokey.Status != http.StatusBadRequest {
				t.Fatalf("handler ran %d times; statuses %d, %d (replayed %v); without a key %d", n, first.Status, again.Status, again.Replayed(), nokey.Status)
			}
		})
	}
}

// A subrouter mounted at "/v1/charges" serves "/v1/charges" and
// "/v1/charges/" with its "/" route (the usual place of a create), through
// stubs chi registers beside the mount. The middleware, used at the root
// or inside the subrouter, protects that route like any other: one run,
// then replays, one record for both spellings of the path (the other
// target is 422), a missing key refused. A subrouter without a "/" route
// answers 404 there, untouched.
func TestSubrouterRootRoute(t *testing.T) {
	for name, atRoot := range map[string]bool{"at the root": true, "in a subrouter": false} {
		t.Run(name, func(t *testing.T) {
			app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
				r := chi.NewRouter()
				mw := chiidem.Middleware(e)
				if atRoot {
					r.Use(mw)
				}
				r.Route("/v1/charges", func(sr chi.Router) {
					if !atRoot {
						sr.Use(mw)
					}
					sr.Post("/", func(w http.ResponseWriter, r *http.Request) {
						writeJSON(w, http.StatusCreated, map[string]any{"op": "charge", "n": h.Count("/v1/charges/")})
					})
				})
				r.Route("/v1/refunds", func(sr chi.Router) {
					if !atRoot {
						sr.Use(mw)
					}
					sr.Post("/{id}", func(w http.ResponseWriter, r *http.Request) {})
				})
				return r
			})
			first := app.Post(t, "/v1/charges", "k", `{}`)
			again := app.Post(t, "/v1/charges", "k", `{}`)
			slash := app.Post(t, "/v1/charges/", "k", `{}`)
			nokey := app.Post(t, "/v1/charges", "", `{}`)
			if n := app.Hooks.Runs("/v1/charges/"); n != 1 || first.Status != http.StatusCreated || !again.Replayed() ||
				slash.ProblemType() != "key-reused" || nokey.ProblemType() != "key-missing" {
				t.Fatalf("handler ran %d times; statuses %d, %d (replayed %v), with a slash %d %s; without a key %d",
					n, first.Status, again.Status, again.Replayed(), slash.Status, slash.Body, nokey.Status)
			}
			for _, key := range []string{"k", ""} {
				if a := app.Post(t, "/v1/refunds", key, `{}`); a.Status != http.StatusNotFound {
					t.Fatalf("POST /v1/refunds (key %q): %d %s; want chi's 404", key, a.Status, a.Body)
				}
			}
		})
	}
}

// reserved is an idem.Observer that keeps the route of the last call the
// engine reserved a key for.
type reserved struct {
	mu    sync.Mutex
	route string
	keys  int
}

func (o *reserved) Reserve(context.Context, string)                        {}
func (o *reserved) StoreCall(context.Context, string, time.Duration, bool) {}
func (o *reserved) FinishFailed(context.Context, string)                   {}
func (o *reserved) Event(context.Context, string, int64)                   {}
func (o *reserved) Step(ctx context.Context, s idem.Step) (context.Context, func(idem.StepEnd)) {
	if s.Name == idem.StepReserve {
		o.mu.Lock()
		o.route = s.Route
		o.mu.Unlock()
	}
	return ctx, func(idem.StepEnd) {}
}

// routeOf serves a request with a new key through h and returns the route
// the engine reserved it under, "" when the request passed through.
func (o *reserved) routeOf(t *testing.T, h http.Handler, method, path string) string {
	t.Helper()
	o.mu.Lock()
	o.route = ""
	o.keys++
	key := "k" + strconv.Itoa(o.keys)
	o.mu.Unlock()
	req := httptest.NewRequest(method, path, nil)
	req.Header.Set("Idempotency-Key", key)
	h.ServeHTTP(httptest.NewRecorder(), req)
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.route
}

// placement is where a test puts the middleware of a new engine: at the
// root of its router, or inside the subrouters it passes to use.
type placement struct {
	atRoot bool
	mw     func(http.Handler) http.Handler
	o      *reserved
}

// use puts the middleware in sr unless it is at the root.
func (p placement) use(sr chi.Router) {
	if !p.atRoot {
		sr.Use(p.mw)
	}
}

// placements runs f with the middleware at the root of r, then with it
// inside the subrouters.
func placements(t *testing.T, f func(t *testing.T, r *chi.Mux, p placement)) {
	for name, atRoot := range map[string]bool{"at the root": true, "in a subrouter": false} {
		t.Run(name, func(t *testing.T) {
			mw, o := observed(t)
			r := chi.NewRouter()
			if atRoot {
				r.Use(mw)
			}
			f(t, r, placement{atRoot, mw, o})
		})
	}
}

// observed returns the middleware of a new engine on a memory store, and
// that engine's observer.
func observed(t *testing.T) (func(http.Handler) http.Handler, *reserved) {
	t.Helper()
	o := &reserved{}
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Observer: o, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return chiidem.Middleware(e), o
}

// The middleware keeps the subrouters it found below the patterns chi
// matched. Routes added once the router has served requests are found all
// the same: a route in a subrouter, a new subrouter, and a route of the
// parent router on a subrouter's stub path, which takes that path from the
// stub for its method (with the middleware at the root, and on that route
// with the subrouter's own below it).
func TestRoutesAddedAfterServing(t *testing.T) {
	ok := func(http.ResponseWriter, *http.Request) {}
	placements(t, func(t *testing.T, r *chi.Mux, p placement) {
		use, o, atRoot, mw := p.use, p.o, p.atRoot, p.mw
		var d chi.Router
		r.Route("/d", func(sr chi.Router) {
			use(sr)
			sr.Post("/", ok)
			sr.Patch("/", ok)
			sr.Post("/a", ok)
			d = sr
		})
		for _, tc := range []struct{ method, path, want string }{
			{"POST", "/d/a", "/d/a"},
			{"POST", "/d", "/d/"},
			{"PATCH", "/d", "/d/"},
			{"PATCH", "/d/", "/d/"},
			{"POST", "/d/b", ""},
			{"POST", "/e/x", ""},
		} {
			if got := o.routeOf(t, r, tc.method, tc.path); got != tc.want {
				t.Errorf("before: %s %s: route %q; want %q", tc.method, tc.path, got, tc.want)
			}
		}

		d.Post("/b", ok)
		r.Route("/e", func(sr chi.Router) {
			use(sr)
			sr.Post("/", ok)
			sr.Post("/x", ok)
		})
		var own chi.Router = r
		if !atRoot {
			own = r.With(mw)
		}
		own.Patch("/d", ok)
		for _, tc := range []struct{ method, path, want string }{
			{"POST", "/d/a", "/d/a"},
			{"POST", "/d/b", "/d/b"},
			{"POST", "/e/x", "/e/x"},
			{"POST", "/e", "/e/"},
			{"POST", "/d", "/d/"},
			{"PATCH", "/d", "/d"}, // the parent's own route now
			{"PATCH", "/d/", "/d/"},
		} {
			if got := o.routeOf(t, r, tc.method, tc.path); got != tc.want {
				t.Errorf("after: %s %s: route %q; want %q", tc.method, tc.path, got, tc.want)
			}
		}
	})
}

// chi's Mount refuses a pattern already mounted, but not one with a
// regexp parameter beside another regexp: mounted again there, the new
// subrouter serves the path, and the middleware's routes are its.
func TestMountedOver(t *testing.T) {
	ok := func(http.ResponseWriter, *http.Request) {}
	placements(t, func(t *testing.T, r *chi.Mux, p placement) {
		use, o := p.use, p.o
		mount := func(route string) {
			r.Route("/{id:[0-9]+}", func(sr chi.Router) {
				use(sr)
				sr.Post(route, ok)
			})
		}
		r.Post("/{name:[a-z]+}", ok)
		mount("/x")
		if got := o.routeOf(t, r, "POST", "/1/x"); got != "/{id:[0-9]+}/x" {
			t.Fatalf("POST /1/x: route %q", got)
		}
		refused := func() (refused any) {
			defer func() { refused = recover() }()
			mount("/y")
			return nil
		}()
		if refused != nil {
			t.Skipf("chi refuses the second mount: %v", refused)
		}
		for _, tc := range []struct{ path, want string }{
			{"/1/y", "/{id:[0-9]+}/y"},
			{"/1/x", ""},
		} {
			if got := o.routeOf(t, r, "POST", tc.path); got != tc.want {
				t.Errorf("POST %s: route %q; want %q", tc.path, got, tc.want)
			}
		}
	})
}

// Middleware of a Group or a With around a Route or a Mount runs once the
// router has matched the mount, before the mount hands the request to the
// subrouter. It protects the subrouter's routes all the same: one run, then
// replays; one record for "/x" and "/x/" (the other target is 422); a
// missing key refused.
func TestInlineMiddlewareAroundMount(t *testing.T) {
	sub := func(count func(string) int) func(chi.Router) {
		return func(s chi.Router) {
			s.Post("/", func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, http.StatusCreated, map[string]any{"op": "create", "n": count("create")})
			})
			s.Post("/y", func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, http.StatusCreated, map[string]any{"op": "y", "n": count("y")})
			})
		}
	}
	type mw = func(http.Handler) http.Handler
	for _, tc := range []struct {
		name, at string
		mount    func(r chi.Router, mw mw, sub func(chi.Router))
	}{
		{"Group, Route", "/x", func(r chi.Router, mw mw, sub func(chi.Router)) {
			r.Group(func(g chi.Router) {
				g.Use(mw)
				g.Route("/x", sub)
			})
		}},
		{"With, Route", "/x", func(r chi.Router, mw mw, sub func(chi.Router)) {
			r.With(mw).Route("/x", sub)
		}},
		{"With, Mount", "/x", func(r chi.Router, mw mw, sub func(chi.Router)) {
			s := chi.NewRouter()
			sub(s)
			r.With(mw).Mount("/x", s)
		}},
		{"Group in a subrouter", "/a/{acct}/x", func(r chi.Router, mw mw, sub func(chi.Router)) {
			r.Route("/a/{acct}", func(a chi.Router) {
				a.Group(func(g chi.Router) {
					g.Use(mw)
					g.Route("/x", sub)
				})
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
				r := chi.NewRouter()
				tc.mount(r, chiidem.Middleware(e), sub(h.Count))
				return r
			})
			x := strings.ReplaceAll(tc.at, "{acct}", "acct_1")
			first := app.Post(t, x+"/y", "k1", `{}`)
			again := app.Post(t, x+"/y", "k1", `{}`)
			if n := app.Hooks.Runs("y"); n != 1 || first.Status != http.StatusCreated || !again.Replayed() {
				t.Fatalf("POST %s/y: handler ran %d times; statuses %d, %d (replayed %v)", x, n, first.Status, again.Status, again.Replayed())
			}
			create := app.Post(t, x, "k2", `{}`)
			slash := app.Post(t, x+"/", "k2", `{}`)
			if n := app.Hooks.Runs("create"); n != 1 || create.Status != http.StatusCreated || slash.ProblemType() != "key-reused" {
				t.Fatalf("POST %s, %s/: handler ran %d times; statuses %d, %d %s", x, x, n, create.Status, slash.Status, slash.Body)
			}
			for _, path := range []string{x, x + "/", x + "/y"} {
				if a := app.Post(t, path, "", `{}`); a.ProblemType() != "key-missing" {
					t.Fatalf("POST %s without a key: %d %s", path, a.Status, a.Body)
				}
			}

			mw, o := observed(t)
			r := chi.NewRouter()
			tc.mount(r, mw, sub(func(string) int { return 0 }))
			for _, tc := range []struct{ path, want string }{
				{x + "/y", tc.at + "/y"},
				{x, tc.at + "/"},
				{x + "/", tc.at + "/"},
				{x + "/z", ""},
			} {
				if got := o.routeOf(t, r, "POST", tc.path); got != tc.want {
					t.Errorf("POST %s: route %q; want %q", tc.path, got, tc.want)
				}
			}
		})
	}
}

// A route of the parent router one segment below a mount's path ("/d/{id}"
// beside the subrouter at "/d") leaves "/d" and "/d/" to the mount's stubs,
// both served by the subrouter's "/": one route, "/d/", and one record for
// both spellings.
func TestRouteBesideMount(t *testing.T) {
	for _, tc := range []struct {
		name   string
		beside func(r chi.Router, h http.HandlerFunc)
	}{
		{"route", func(r chi.Router, h http.HandlerFunc) { r.Post("/d/{id}", h) }},
		{"subrouter", func(r chi.Router, h http.HandlerFunc) {
			r.Route("/d/{id}", func(s chi.Router) { s.Post("/", h) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
				r := chi.NewRouter()
				r.Use(chiidem.Middleware(e))
				r.Route("/d", func(s chi.Router) {
					s.Post("/", func(w http.ResponseWriter, r *http.Request) {
						writeJSON(w, http.StatusCreated, map[string]any{"op": "create", "n": h.Count("create")})
					})
				})
				tc.beside(r, func(w http.ResponseWriter, r *http.Request) {
					writeJSON(w, http.StatusOK, map[string]any{"op": "update", "n": h.Count("update")})
				})
				return r
			})
			first := app.Post(t, "/d", "k", `{}`)
			again := app.Post(t, "/d", "k", `{}`)
			slash := app.Post(t, "/d/", "k", `{}`)
			if n := app.Hooks.Runs("create"); n != 1 || first.Status != http.StatusCreated || !again.Replayed() || slash.ProblemType() != "key-reused" {
				t.Fatalf("handler ran %d times; statuses %d, %d (replayed %v), with a slash %d %s",
					n, first.Status, again.Status, again.Replayed(), slash.Status, slash.Body)
			}
			if a := app.Post(t, "/d/7", "k", `{}`); a.Status != http.StatusOK || app.Hooks.Runs("update") != 1 {
				t.Fatalf("POST /d/7: %d %s", a.Status, a.Body)
			}
		})
	}
}
