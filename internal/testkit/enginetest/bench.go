package enginetest

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
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

// BenchRetained measures what the store keeps per new key: b.N keys go
// through the middleware as BenchMiddleware's first does, then a collection
// leaves what the store holds. It reports the bytes retained per key, those
// of them the garbage collector must scan (objects with pointers), and the
// objects per key. Run it with a fixed count (-benchtime 200000x): the
// figures are per key, the time is not the point.
func BenchRetained(b *testing.B, st BenchStore) {
	b.Run(st.Name, func(b *testing.B) {
		s := st.Open(b)
		e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		h := e.Middleware(http.HandlerFunc(benchHandler))
		var m0, m1 runtime.MemStats
		scan := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
		runtime.GC()
		runtime.ReadMemStats(&m0)
		metrics.Read(scan)
		s0 := scan[0].Value.Uint64()
		i := 0
		for ; b.Loop(); i++ {
			if w := serve(h, benchKey(i)); w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		metrics.Read(scan)
		n := float64(i)
		b.ReportMetric(float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/n, "B/key")
		b.ReportMetric(float64(int64(scan[0].Value.Uint64())-int64(s0))/n, "scanB/key")
		b.ReportMetric(float64(int64(m1.HeapObjects)-int64(m0.HeapObjects))/n, "objects/key")
		runtime.KeepAlive(s)
	})
}
