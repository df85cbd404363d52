package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The command serves the API and the provider on real sockets, charges a
// payment through its outbox, and shuts down cleanly when its context ends
// (what SIGTERM does in main).
func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	db := "sqlite:" + filepath.Join(t.TempDir(), "payments.db")
	go func() {
		done <- run(ctx, []string{"--db", db, "--listen", "127.0.0.1:0", "--provider-listen", "127.0.0.1:0", "--log-level", "warn"},
			io.Discard, func(api, provider string) { addrs <- [2]string{api, provider} })
	}()
	var api, provider string
	select {
	case a := <-addrs:
		api, provider = "http://"+a[0], "http://"+a[1]
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not listening after 30s")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	send := func(method, url, body string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer acct_1")
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", `"order-1"`)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	const body = `{"amount":1250,"currency":"eur","customer":"cus_1"}`
	code, _, first := send(http.MethodPost, api+"/v1/payments", body)
	if code != http.StatusCreated {
		t.Fatalf("POST: %d %s", code, first)
	}
	code, h, again := send(http.MethodPost, api+"/v1/payments", body)
	if code != http.StatusCreated || again != first || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v %s", code, h, again)
	}
	var p struct{ ID, Status string }
	if err := json.Unmarshal([]byte(first), &p); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for p.Status != "succeeded" {
		if time.Now().After(deadline) {
			t.Fatalf("payment still %s after 20s", p.Status)
		}
		time.Sleep(50 * time.Millisecond)
		_, _, b := send(http.MethodGet, api+"/v1/payments/"+p.ID, "")
		if err := json.Unmarshal([]byte(b), &p); err != nil {
			t.Fatal(err)
		}
	}
	_, _, stats := send(http.MethodGet, provider+"/admin/stats", "")
	if !strings.Contains(stats, `"charges":1,`) {
		t.Fatalf("provider stats %s; want one charge", stats)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no shutdown after 20s")
	}
}
