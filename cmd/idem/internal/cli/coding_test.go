package cli

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// A client that compresses its request bodies gets keys through the
// proxy: the upstream receives the gzip bytes as sent and decodes them
// itself, and a retry whose compressor wrote other bytes (gzip's header
// holds the time) gets the first answer replayed, the upstream called once.
func TestProxyCompressedRequestBody(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		zr, err := gzip.NewReader(r.Body)
		if err != nil || r.Header.Get("Content-Encoding") != "gzip" {
			http.Error(w, "not gzip", http.StatusBadRequest)
			return
		}
		content, _ := io.ReadAll(zr)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(content)
	}))
	defer upstream.Close()
	_, base := startProxy(t, ProxyConfig{Upstream: upstream.URL, Store: "memory:"})
	const content = `{"amount":100,"currency":"eur"}`
	for i := range 2 {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.ModTime = time.Date(2026, 11, 27, 7, 0, i, 0, time.UTC)
		zw.Write([]byte(content))
		zw.Close()
		req, err := http.NewRequest("POST", base+"/v1/charges", &b)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		req.Header.Set("Idempotency-Key", `"gz-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(body) != content || (i == 1) != (resp.Header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("attempt %d: %d %q replayed=%q", i+1, resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
}
