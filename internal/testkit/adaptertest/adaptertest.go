// Package adaptertest is the one suite every framework adapter runs: the
// adapter's test builds a real application on its framework with the
// routes below, and Run drives it over real HTTP.
//
// Routes the application serves, all through the adapter and all POST
// (JSON members in any order):
//
//	/d/charges       201 {"op":"charge","n":N}    (in a group or subrouter)
//	/d/refunds       201 {"op":"refund","n":N}    (in the same group)
//	/orders/{id}     200 {"order":"<id>","n":N}   (a path parameter)
//	/fail/{status}   the framework's own error idiom with that status
//	/panic           panics; the framework's recovery answers 500
//	/slow            Hooks.Block, then 200 {"op":"slow","n":N}
//	/nocontent       sets status 204 only, the framework's way
//
// N is Hooks.Count for the route: the number of times its handler ran.
package adaptertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

// Hooks are what the application's handlers call.
type Hooks struct {
	mu      sync.Mutex
	counts  map[string]int
	blocked int
	entered chan struct{}
	release chan struct{}
}

// Count records one run of the handler of route (named as in the package
// documentation: "/orders/{id}", "/fail/{status}") and returns how many
// runs it has had, this one included.
func (h *Hooks) Count(route string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[route]++
	return h.counts[route]
}

// Runs returns how many times the handler of route ran.
func (h *Hooks) Runs(route string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[route]
}

// Block, in the first run of the handler of /slow, tells the suite it is
// running and waits until the suite lets it finish. Later runs (an adapter
// that let a duplicate through) return at once, so such a defect fails
// the suite instead of hanging it.
func (h *Hooks) Block() {
	h.mu.Lock()
	h.blocked++
	first := h.blocked == 1
	h.mu.Unlock()
	if first {
		h.entered <- struct{}{}
		<-h.release
	}
}

// Build returns the application, protected by e through the adapter.
type Build func(t *testing.T, e *idem.Engine, h *Hooks) http.Handler

// App is an application under test: its server, engine and hooks.
type App struct {
	URL    string
	Engine *idem.Engine
	Hooks  *Hooks
	// client is the server's own (httptest.Server.Client): the subtests
	// run in parallel, and each server's Close closes the idle connections
	// of http.DefaultTransport, which broke another subtest's request
	// about to reuse one ("CloseIdleConnections called").
	client *http.Client
}

// Start builds the application on a fresh memory store and serves it.
func Start(t *testing.T, build Build) *App {
	t.Helper()
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := &Hooks{counts: map[string]int{}, entered: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(build(t, e, h))
	t.Cleanup(srv.Close)
	return &App{URL: srv.URL, Engine: e, Hooks: h, client: srv.Client()}
}

// Answer is a response as the client saw it.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// Replayed reports whether the answer says it is a replay.
func (a Answer) Replayed() bool { return a.Header.Get("Idempotent-Replayed") == "true" }

// ProblemType returns the slug of a problem document's type ("key-reused"),
// or "" when the answer is not one.
func (a Answer) ProblemType() string {
	var p struct {
		Type string `json:"type"`
	}
	if !strings.HasPrefix(a.Header.Get("Content-Type"), "application/problem+json") || json.Unmarshal(a.Body, &p) != nil {
		return ""
	}
	_, slug, _ := strings.Cut(p.Type, "#")
	return slug
}

// Post sends a JSON body to path with key ("" sends none).
func (a *App) Post(t *testing.T, path, key, body string) Answer {
	t.Helper()
	ans, err := a.post(path, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return ans
}

func (a *App) post(path, key, body string) (Answer, error) {
	req, err := http.NewRequest(http.MethodPost, a.URL+path, strings.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

func want(t *testing.T, a Answer, status int, replayed bool) {
	t.Helper()
	if a.Status != status || a.Replayed() != replayed {
		t.Fatalf("got %d replayed=%v %s; want %d replayed=%v", a.Status, a.Replayed(), a.Body, status, replayed)
	}
}

func wantProblem(t *testing.T, a Answer, status int, slug string) {
	t.Helper()
	if a.Status != status || a.ProblemType() != slug {
		t.Fatalf("got %d %s; want %d problem %q", a.Status, a.Body, status, slug)
	}
}

// wantFields checks members of a JSON answer, given as name, value pairs.
func wantFields(t *testing.T, a Answer, pairs ...any) {
	t.Helper()
	var got map[string]any
	if err := json.Unmarshal(a.Body, &got); err != nil {
		t.Fatalf("answer %q: %v", a.Body, err)
	}
	for i := 0; i < len(pairs); i += 2 {
		name := pairs[i].(string)
		if fmt.Sprint(got[name]) != fmt.Sprint(pairs[i+1]) {
			t.Fatalf("answer %s: %s is %v; want %v", a.Body, name, got[name], pairs[i+1])
		}
	}
}

// wantReplayOf checks that again is a replay of first: same status and body.
func wantReplayOf(t *testing.T, again, first Answer) {
	t.Helper()
	want(t, again, first.Status, true)
	if !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("replayed %q; the first answer was %q", again.Body, first.Body)
	}
}

func wantRuns(t *testing.T, h *Hooks, route string, n int) {
	t.Helper()
	if got := h.Runs(route); got != n {
		t.Fatalf("handler of %s ran %d times; want %d", route, got, n)
	}
}

// Run runs the suite against the application build makes.
func Run(t *testing.T, build Build) {
	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		first := app.Post(t, "/d/charges", "k1", `{"amount":100}`)
		want(t, first, http.StatusCreated, false)
		wantFields(t, first, "op", "charge", "n", 1)
		again := app.Post(t, "/d/charges", "k1", `{"amount":100}`)
		wantReplayOf(t, again, first)
		if again.Header.Get("Content-Type") != first.Header.Get("Content-Type") {
			t.Fatalf("replayed Content-Type %q; first %q", again.Header.Get("Content-Type"), first.Header.Get("Content-Type"))
		}
		wantRuns(t, app.Hooks, "/d/charges", 1)
	})

	t.Run("RoutesOfOneGroupHaveTheirOwnRecords", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		charge := app.Post(t, "/d/charges", "shared", `{"amount":100}`)
		refund := app.Post(t, "/d/refunds", "shared", `{"amount":100}`)
		want(t, charge, http.StatusCreated, false)
		want(t, refund, http.StatusCreated, false)
		wantFields(t, charge, "op", "charge", "n", 1)
		wantFields(t, refund, "op", "refund", "n", 1)
		again := app.Post(t, "/d/refunds", "shared", `{"amount":100}`)
		wantReplayOf(t, again, refund)
		wantRuns(t, app.Hooks, "/d/charges", 1)
		wantRuns(t, app.Hooks, "/d/refunds", 1)
	})

	t.Run("SameRouteOtherResourceIsKeyReused", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		first := app.Post(t, "/orders/1", "k", `{}`)
		want(t, first, http.StatusOK, false)
		wantFields(t, first, "order", "1", "n", 1)
		other := app.Post(t, "/orders/2", "k", `{}`)
		wantProblem(t, other, http.StatusUnprocessableEntity, "key-reused")
		wantRuns(t, app.Hooks, "/orders/{id}", 1)
		// The record of order 1 is untouched.
		want(t, app.Post(t, "/orders/1", "k", `{}`), http.StatusOK, true)
	})

	t.Run("OtherBodyIsKeyReused", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		want(t, app.Post(t, "/d/charges", "k", `{"amount":100}`), http.StatusCreated, false)
		wantProblem(t, app.Post(t, "/d/charges", "k", `{"amount":999}`), http.StatusUnprocessableEntity, "key-reused")
		wantRuns(t, app.Hooks, "/d/charges", 1)
	})

	t.Run("MissingKeyIsRefusedBeforeTheHandler", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		wantProblem(t, app.Post(t, "/d/charges", "", `{}`), http.StatusBadRequest, "key-missing")
		wantRuns(t, app.Hooks, "/d/charges", 0)
	})

	t.Run("ClientErrorIsStoredAndReplayed", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		first := app.Post(t, "/fail/400", "k", `{}`)
		want(t, first, http.StatusBadRequest, false)
		if len(first.Body) == 0 {
			t.Fatal("the framework's error answer has no body")
		}
		again := app.Post(t, "/fail/400", "k", `{}`)
		wantReplayOf(t, again, first)
		wantRuns(t, app.Hooks, "/fail/{status}", 1)
	})

	t.Run("ServerErrorReleasesTheKey", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		first := app.Post(t, "/fail/500", "k", `{}`)
		want(t, first, http.StatusInternalServerError, false)
		if len(first.Body) == 0 {
			t.Fatal("the framework's error answer has no body")
		}
		want(t, app.Post(t, "/fail/500", "k", `{}`), http.StatusInternalServerError, false)
		wantRuns(t, app.Hooks, "/fail/{status}", 2)
	})

	t.Run("PanicLeavesTheOutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		// The framework's recovery answers the client.
		want(t, app.Post(t, "/panic", "k", `{}`), http.StatusInternalServerError, false)
		wantProblem(t, app.Post(t, "/panic", "k", `{}`), http.StatusConflict, "outcome-unknown")
		wantRuns(t, app.Hooks, "/panic", 1)
	})

	t.Run("DuplicateWhileInFlightIs409", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		type result struct {
			a   Answer
			err error
		}
		done := make(chan result, 1)
		go func() {
			a, err := app.post("/slow", "k", `{}`)
			done <- result{a, err}
		}()
		<-app.Hooks.entered
		dup := app.Post(t, "/slow", "k", `{}`)
		app.Hooks.release <- struct{}{}
		wantProblem(t, dup, http.StatusConflict, "request-in-progress")
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		first := res.a
		want(t, first, http.StatusOK, false)
		again := app.Post(t, "/slow", "k", `{}`)
		wantReplayOf(t, again, first)
		wantRuns(t, app.Hooks, "/slow", 1)
	})

	t.Run("StatusOnlyAnswerIsStored", func(t *testing.T) {
		t.Parallel()
		app := Start(t, build)
		want(t, app.Post(t, "/nocontent", "k", `{}`), http.StatusNoContent, false)
		want(t, app.Post(t, "/nocontent", "k", `{}`), http.StatusNoContent, true)
		wantRuns(t, app.Hooks, "/nocontent", 1)
	})
}
