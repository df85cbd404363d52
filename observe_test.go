package idem_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/store/memory"
)

// The engine reports each step of a call with the store, the scope, the
// route and the fence: reserve then complete for a new key, reserve then
// replay for its retry.
func TestObserverSteps(t *testing.T) {
	t.Parallel()
	obs := &obstest.Recorder{}
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
	})))
	for range 2 {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != 201 {
			t.Fatalf("status %d", w.Code)
		}
	}
	steps := obs.Steps()
	var got []string
	for _, s := range steps {
		got = append(got, s.Name+":"+s.End.Outcome)
		if s.Store != "memory" || s.Route != "/v1/charges" || s.Scope == "" {
			t.Errorf("step %+v: store, route or scope missing", s)
		}
		if s.End.Err != nil {
			t.Errorf("step %s failed: %v", s.Name, s.End.Err)
		}
		if s.End.Fence == 0 {
			t.Errorf("step %s ended without a fence", s.Name)
		}
	}
	if want := "reserve:created complete: reserve:replay replay:replay"; strings.Join(got, " ") != want {
		t.Fatalf("steps %q, want %q", strings.Join(got, " "), want)
	}
	if steps[1].Fence != steps[0].End.Fence || steps[3].Fence != steps[0].End.Fence {
		t.Fatalf("fences differ: %+v", steps)
	}
	if r := obs.Reserves(); r["created"] != 1 || r["replay"] != 1 {
		t.Fatalf("reservations %v", r)
	}
	if c := obs.StoreCalls(); c["reserve"] != 2 || c["complete"] != 1 {
		t.Fatalf("store calls %v", c)
	}
}
