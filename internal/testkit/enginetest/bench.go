package enginetest

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

const benchBody = `{"amount":1000,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","description":"order 1234"}`

func benchHandler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
}

// BenchStore opens a fresh store for a benchmark.
type BenchStore struct {
	Name string
	Open func(b *testing.B) store.Store
}

// BenchMemory is the memory store.
var BenchMemory = BenchStore{"memory", func(*testing.B) store.Store { return memory.New(memory.Config{}) }}

// BenchMiddleware compares a small JSON POST handler bare, behind the
// middleware on a new key (first) and behind it on a completed key
// (replay), on each store. Every variant builds the same request, key
// header included, so the differences are the middleware's own cost.
func BenchMiddleware(b *testing.B, stores ...BenchStore) {
	for _, st := range stores {
		b.Run(st.Name+"/bare", func(b *testing.B) {
			runBench(b, http.HandlerFunc(benchHandler), func(i int) string { return benchKey(i) })
		})
		b.Run(st.Name+"/first", func(b *testing.B) {
			s := st.Open(b)
			e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			runBench(b, e.Middleware(http.HandlerFunc(benchHandler)), func(i int) string { return benchKey(i) })
		})
		b.Run(st.Name+"/replay", func(b *testing.B) {
			s := st.Open(b)
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
