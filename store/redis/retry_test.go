package redis

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
)

// TestServerDeathMidCommandIsRetryable stops a private redis-server with a
// command of the store in flight, then kills it: the command's connection
// breaks under it and the store reports a retryable error. The client is
// told not to retry by itself, so the store's own error surfaces.
func TestServerDeathMidCommandIsRetryable(t *testing.T) {
	if os.Getenv("IDEM_TEST_REDIS_CLUSTER") != "1" {
		testenv.Skip(t, "IDEM_TEST_REDIS_CLUSTER is not 1: this test starts its own redis-server")
	}
	t.Parallel()
	ctx := context.Background()
	port := freePorts(t, 1)[0]
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	client := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	poll(t, pctx, addr+" answers PING", func() bool { return client.Ping(pctx).Err() == nil })
	s, err := New(client, Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := reserveParams("k")
	if _, err := s.Reserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, p.Scope, p.Key)
		done <- err
	}()
	// The Get is written to the frozen server's socket; no answer can come
	// until the server dies.
	select {
	case err := <-done:
		t.Fatalf("Get answered by a stopped server: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !store.IsRetryable(err) {
		t.Fatalf("Get whose server died under it: %v, want a retryable error", err)
	}
}

// TestRefusedConnectionIsRetryable points a store at a port nobody listens
// on: the operations that reach the server fail retryable; definite
// answers stay final.
func TestRefusedConnectionIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, reserveParams("k")); !store.IsRetryable(err) {
		t.Fatalf("Reserve with the server down: %v, want a retryable error", err)
	}
	if _, _, err := s.List(ctx, store.ListParams{Limit: 10}); !store.IsRetryable(err) {
		t.Errorf("List with the server down: %v, want a retryable error", err)
	}
	live := newStoreOn(t)
	if err := live.Delete(ctx, store.DeleteParams{Scope: "s", Key: "missing"}); !errors.Is(err, store.ErrNotFound) || store.IsRetryable(err) {
		t.Fatalf("Delete of a missing record: %v, want a final ErrNotFound", err)
	}
}

func newStoreOn(t *testing.T) *Store {
	s, _ := newTestStore(t, singleNode(t))
	return s
}

// TestNoReplicasIsRetryable: a master configured with min-replicas-to-write
// refuses writes while too few replicas are connected (during a failover
// or a replica's restart), and ran nothing of the refused script: the
// failure is transient, so the engine retries a completion instead of
// leaving the record to become unknown.
func TestNoReplicasIsRetryable(t *testing.T) {
	t.Parallel()
	addr := startRedis(t, "--save", "", "--appendonly", "no", "--min-replicas-to-write", "1")
	s := openAt(t, addr, Config{})
	_, err := s.Reserve(ctx, reserveParams("k"))
	if !store.IsRetryable(err) {
		t.Fatalf("Reserve on a master without its replicas: %v, want a retryable error", err)
	}
	if _, gerr := s.Get(ctx, "tenant POST /pay", "k"); !errors.Is(gerr, store.ErrNotFound) {
		t.Fatalf("the refused Reserve left a record: %v", gerr)
	}
}
