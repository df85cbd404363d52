package redis

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// testCluster is a Redis Cluster of local redis-server processes, without
// replicas and without persistence, torn down when the test ends.
type testCluster struct {
	addrs []string
}

// startCluster starts and creates a cluster of n masters, or skips the test
// unless IDEM_TEST_REDIS_CLUSTER=1.
func startCluster(t testing.TB, n int) *testCluster {
	t.Helper()
	if os.Getenv("IDEM_TEST_REDIS_CLUSTER") != "1" {
		testenv.Skip(t, "IDEM_TEST_REDIS_CLUSTER is not 1: skipping the Redis Cluster tests (they need redis-server and redis-cli on PATH)")
	}
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("IDEM_TEST_REDIS_CLUSTER=1 but %s is not on PATH: %v", bin, err)
		}
	}
	ports := freePorts(t, n)
	cl := &testCluster{}
	for i, port := range ports {
		dir := t.TempDir()
		var out bytes.Buffer
		cmd := exec.Command("redis-server",
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000",
			"--dir", dir,
			"--save", "",
			"--appendonly", "no",
		)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server %d: %v", i, err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("redis-server :%d output:\n%s", port, out.String())
			}
		})
		cl.addrs = append(cl.addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := make([]*goredis.Client, n)
	for i, addr := range cl.addrs {
		nodes[i] = goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
		defer nodes[i].Close()
		poll(t, ctx, addr+" answers PING", func() bool { return nodes[i].Ping(ctx).Err() == nil })
	}

	args := append([]string{"--cluster", "create"}, cl.addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for i, addr := range cl.addrs {
		poll(t, ctx, addr+" reports cluster_state:ok", func() bool {
			info, err := nodes[i].ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n))
		})
	}
	return cl
}

// poll calls ok until it reports true or ctx ends.
func poll(t testing.TB, ctx context.Context, what string, ok func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-tick.C:
		}
	}
}

// freePorts finds n loopback ports whose cluster bus port (port+10000) is
// free too. The listeners are held until all are chosen, so no port is
// picked twice; another process may still take one before redis-server
// binds it, which then fails the test loudly.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for attempt := 0; len(ports) < n && attempt < 200; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		held = append(held, bus)
		ports = append(ports, port)
	}
	if len(ports) < n {
		t.Fatalf("found %d free port pairs, want %d", len(ports), n)
	}
	return ports
}

// url is the store URL of the cluster.
func (c *testCluster) url() string {
	return "redis+cluster://" + strings.Join(c.addrs, ",")
}

// client returns a new cluster client, closed when the test ends.
func (c *testCluster) client(t testing.TB) *goredis.ClusterClient {
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
