package redis

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
)

// startRedis starts a private redis-server with args, stopped when the
// test ends, and returns its address.
func startRedis(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Skip(t, "redis-server is not on PATH: skipping the test that starts its own Redis")
	}
	port := freePorts(t, 1)[0]
	var out bytes.Buffer
	cmd := exec.Command("redis-server", append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", t.TempDir()}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("redis-server :%d:\n%s", port, out.String())
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	poll(t, ctx, addr+" answers PING", func() bool { return c.Ping(ctx).Err() == nil })
	return addr
}

func openAt(t *testing.T, addr string, cfg Config) *Store {
	t.Helper()
	s, err := Open(context.Background(), "redis://"+addr+"/0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A Redis without the append-only file and without snapshots (as the
// shared test server runs) loses everything at a restart: at risk.
func TestCheckDurabilityWithoutPersistence(t *testing.T) {
	t.Parallel()
	s := openAt(t, startRedis(t, "--appendonly", "no", "--save", ""), Config{})
	d, err := s.CheckDurability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.DurabilityAtRisk || d.Replicas != 0 || !strings.Contains(strings.Join(d.Warnings, " "), "empties it") ||
		d.Settings["appendonly"] != "no" {
		t.Fatalf("report %v %q, want at risk saying a restart empties it", d, d.Warnings)
	}
}

// A master with the append-only file and a replica: at risk while writes
// do not wait for the replica, safe with WaitReplicas 1, whose writes then
// succeed; WaitReplicas 2 fails every write (retryable) and warns.
func TestCheckDurabilityAndWaitWithAReplica(t *testing.T) {
	t.Parallel()
	primary := startRedis(t, "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(primary)
	startRedis(t, "--replicaof", host, port, "--appendonly", "yes", "--save", "")
	ctx := context.Background()
	lax := openAt(t, primary, Config{})
	poll(t, ctx, "the replica to be in sync", func() bool {
		info, err := lax.client.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	})
	d, _ := lax.CheckDurability(ctx)
	if d.State != store.DurabilityAtRisk || !strings.Contains(strings.Join(d.Warnings, " "), "wait_replicas") {
		t.Fatalf("replica, writes not waiting: %v %q, want at risk naming wait_replicas", d, d.Warnings)
	}

	strict := openAt(t, primary, Config{WaitReplicas: 1})
	if d, _ := strict.CheckDurability(ctx); d.State != store.DurabilitySafe || !d.Synchronous || len(d.Warnings) != 0 {
		t.Fatalf("replica, writes waiting for it: %v %q, want safe", d, d.Warnings)
	}
	p := store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown}
	res, err := strict.Reserve(ctx, p)
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("Reserve waiting for 1 replica: %v %v", res.Outcome, err)
	}
	if err := strict.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: res.Record.Fence},
		Response: store.Response{Status: 201}}); err != nil {
		t.Fatalf("Complete waiting for 1 replica: %v", err)
	}

	tooMany := openAt(t, primary, Config{WaitReplicas: 2, WaitTimeout: 50 * time.Millisecond})
	p.Key = "k2"
	_, err = tooMany.Reserve(ctx, p)
	if err == nil || !store.IsRetryable(err) || !strings.Contains(err.Error(), "1 of 2 replica(s)") {
		t.Fatalf("Reserve waiting for 2 replicas with 1 attached: %v, want a retryable failure saying 1 of 2", err)
	}
	if d, _ := tooMany.CheckDurability(ctx); d.Synchronous || len(d.Warnings) == 0 {
		t.Errorf("2 replicas wanted, 1 attached: %v %q, want a warning", d, d.Warnings)
	}
}

// A server that refuses CONFIG (managed Redis) gives unknown with a
// warning, not an error.
func TestCheckDurabilityWithoutConfig(t *testing.T) {
	t.Parallel()
	s := openAt(t, startRedis(t, "--appendonly", "yes", "--rename-command", "CONFIG", ""), Config{})
	d, err := s.CheckDurability(context.Background())
	if err != nil {
		t.Fatalf("CONFIG disabled: %v, want a report", err)
	}
	if d.State != store.DurabilityUnknown || !strings.Contains(strings.Join(d.Warnings, " "), "CONFIG") {
		t.Fatalf("CONFIG disabled: %v %q, want unknown with a warning naming CONFIG", d, d.Warnings)
	}
}
