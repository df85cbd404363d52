package cli_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/cmd/idem/internal/cli"
	"github.com/idem-go/idem/internal/testkit/clienttest"
)

// The client in front of the idem proxy, in front of an API that knows
// nothing of keys: a connection cut between client and proxy after the
// upstream ran costs a retry, never a second upstream execution.
func TestThroughProxy(t *testing.T) {
	t.Parallel()
	var executions atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := executions.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	}))
	defer upstream.Close()

	p, err := cli.NewProxy(context.Background(), cli.ProxyConfig{
		Listen: "127.0.0.1:0", Upstream: upstream.URL, Store: "memory:", NoMaintenance: true, TenantFrom: []string{"authorization"},
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	r := clienttest.NewRelay(t, p.Addr().String())
	r.Drop.Store(2) // the first two connections lose the proxy's answer
	tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
	resp, body, err := clienttest.Post(t, context.Background(), tr, r.URL()+"/v1/charges", `{"amount":100}`,
		"Authorization", "Bearer sk_test_client")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` {
		t.Fatalf("got %d %s, want the first execution's answer", resp.StatusCode, body)
	}
	if !client.Replayed(resp) || client.Attempts(resp) != 3 {
		t.Errorf("Replayed %v after %d attempts; want true after 3", client.Replayed(resp), client.Attempts(resp))
	}
	if n := executions.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
	clienttest.CheckAllClosed(t, tracker)
}
