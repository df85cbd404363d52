package cli

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkProxy measures requests through the proxy with a fresh key each
// (reserve, upstream call, complete) and parallel clients, which is where
// the upstream transport's idle-connection limit shows.
func BenchmarkProxy(b *testing.B) {
	for _, kind := range []string{"memory", "sqlite"} {
		b.Run(kind, func(b *testing.B) {
			dsn := "memory:"
			if kind == "sqlite" {
				dsn = "sqlite:" + filepath.Join(b.TempDir(), "idem.db")
			}
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"id":"ch_1","amount":100}`)
			}))
			defer up.Close()
			p, err := NewProxy(context.Background(), ProxyConfig{
				Listen: "127.0.0.1:0", Upstream: up.URL, Store: dsn, Migrate: true, SingleTenant: true,
				Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Serve(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					b.Error(err)
				}
			}()
			tr := &http.Transport{MaxIdleConnsPerHost: 256}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			url := "http://" + p.Addr().String() + "/v1/charges"
			var seq atomic.Int64
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("POST", url, strings.NewReader(`{"amount":100}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", strconv.FormatInt(seq.Add(1), 10))
					resp, err := c.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		})
	}
}
