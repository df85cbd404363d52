package idem_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/sqlite"
)

type benchStore struct {
	name string
	open func(b *testing.B) store.Store
}

// benchStores are the stores BenchmarkMiddleware runs against: the
// embedded ones here, the server-backed ones when their test environment
// variables are set (bench_servers_test.go).
var benchStores = []benchStore{
	{"memory", func(*testing.B) store.Store { return memory.New(memory.Config{}) }},
	{"sqlite", func(b *testing.B) store.Store {
		s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), sqlite.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}},
}

const benchBody = `{"amount":1000,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","description":"order 1234"}`

func benchHandler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
}

// BenchmarkMiddleware compares a small JSON POST handler bare, behind the
// middleware on a new key (first) and behind it on a completed key
// (replay). Every variant builds the same request, key header included, so
// the differences are the middleware's own cost.
func BenchmarkMiddleware(b *testing.B) {
	for _, st := range benchStores {
		b.Run(st.name+"/bare", func(b *testing.B) {
			runBench(b, http.HandlerFunc(benchHandler), func(i int) string { return benchKey(i) })
		})
		b.Run(st.name+"/first", func(b *testing.B) {
			s := st.open(b)
			e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			runBench(b, e.Middleware(http.HandlerFunc(benchHandler)), func(i int) string { return benchKey(i) })
		})
		b.Run(st.name+"/replay", func(b *testing.B) {
			s := st.open(b)
			e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			h := e.Middleware(http.HandlerFunc(benchHandler))
			serve(h, benchKey(-1)) // complete the key once
			runBench(b, h, func(int) string { return benchKey(-1) })
		})
	}
}

func benchKey(i int) string {
	return `"bench-` + strconv.Itoa(i) + `"`
}

func serve(h http.Handler, key string) *httptest.ResponseRecorder {
	r, _ := http.NewRequest(http.MethodPost, "http://api.test/v1/charges", strings.NewReader(benchBody))
	r.Header["Content-Type"] = []string{"application/json"}
	r.Header["Idempotency-Key"] = []string{key}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func runBench(b *testing.B, h http.Handler, key func(int) string) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if w := serve(h, key(i)); w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}
