package cli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/testenv"
)

// pgCluster is a private PostgreSQL server a test starts and stops itself,
// on its own port, so that it never touches the shared server.
type pgCluster struct {
	bin  string // directory of initdb and postgres
	dir  string // data directory
	port int
	cred *syscall.Credential // when the test runs as root: postgres refuses root
	cmd  *exec.Cmd
	done chan error
}

// newPGCluster creates a cluster with initdb, not started. It skips the
// test when PostgreSQL's server binaries are not installed.
func newPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		testenv.Skip(t, "initdb is not installed: skipping the test that starts its own PostgreSQL")
	}
	if real, err := filepath.EvalSymlinks(initdb); err == nil {
		initdb = real
	}
	root, err := os.MkdirTemp("", "idem-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	c := &pgCluster{bin: filepath.Dir(initdb), dir: filepath.Join(root, "data"), port: freePort(t)}
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Skip(t, "running as root without a postgres user: PostgreSQL refuses to run as root")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		os.Chmod(root, 0o755)
		if err := os.Chown(c.dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	cmd := c.command(filepath.Join(c.bin, "initdb"), "-D", c.dir, "-U", "postgres", "--auth=trust", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	t.Cleanup(func() { c.stop(t) })
	return c
}

func (c *pgCluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// url is the cluster's DSN for the proxy.
func (c *pgCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", c.port)
}

// start starts the server and waits until it accepts connections.
func (c *pgCluster) start(t *testing.T) {
	t.Helper()
	c.cmd = c.command(filepath.Join(c.bin, "postgres"), "-D", c.dir, "-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+c.dir, "-c", "fsync=off")
	log, err := os.Create(filepath.Join(filepath.Dir(c.dir), "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	c.cmd.Stdout, c.cmd.Stderr = log, log
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("postgres: %v", err)
	}
	c.done = make(chan error, 1)
	go func() { c.done <- c.cmd.Wait() }()
	waitFor(t, "the private PostgreSQL to accept connections", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, c.url())
		if err != nil {
			return false
		}
		conn.Close(ctx)
		return true
	})
}

// stop stops the server (fast shutdown) if it runs.
func (c *pgCluster) stop(t *testing.T) {
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
	c.cmd = nil
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// A proxy started while its database is down serves anyway: protected
// requests get 503 with Retry-After, readiness says not ready; once the
// database comes up the proxy opens and migrates the store and serves.
func TestProxyStartsWhileTheStoreIsDown(t *testing.T) {
	t.Parallel()
	pg := newPGCluster(t)
	api := &chargeAPI{}
	var log safeBuffer
	p, base := startProxy(t, ProxyConfig{Upstream: newUpstream(t, api).URL, Store: pg.url(), Admin: "127.0.0.1:0",
		TenantFrom: []string{"trusted-header:X-Tenant"}, Logger: log.logger()})
	c := client(t)
	ready := "http://" + p.AdminAddr().String() + "/readyz"

	for range 2 {
		r := send(t, c, "POST", base+"/v1/charges", "k", `{}`, "X-Tenant", "acme")
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" ||
			problemType(t, r) != idem.ProblemBase+"store-unavailable" {
			t.Fatalf("store down: %d %v %s, want 503 store-unavailable with Retry-After", r.status, r.header, r.body)
		}
		if r := send(t, c, "GET", ready, "", ""); r.status != http.StatusServiceUnavailable ||
			strings.Contains(string(r.body), strconv.Itoa(pg.port)) || strings.Contains(string(r.body), "postgres") {
			t.Fatalf("readyz with the store down: %d %s, want 503 naming neither the port nor the user", r.status, r.body)
		}
	}
	// Unprotected requests do not need the store.
	if r := send(t, c, "GET", base+"/v1/charges", "", ""); r.status != http.StatusCreated {
		t.Errorf("GET with the store down: %d", r.status)
	}
	if api.calls.Load() != 1 {
		t.Fatalf("upstream calls %d, want 1 (the GET)", api.calls.Load())
	}

	pg.start(t)
	var r reply
	waitFor(t, "the proxy to serve once the database is up", func() bool {
		r = send(t, c, "POST", base+"/v1/charges", "k", `{}`, "X-Tenant", "acme")
		if r.status != http.StatusServiceUnavailable && r.status != http.StatusCreated {
			t.Fatalf("while the store comes up: %d %s", r.status, r.body)
		}
		return r.status == http.StatusCreated
	})
	if r := send(t, c, "POST", base+"/v1/charges", "k", `{}`, "X-Tenant", "acme"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %v, want a replay", r.status, r.header)
	}
	if r := send(t, c, "GET", ready, "", ""); r.status != http.StatusOK {
		t.Errorf("readyz with the store up: %d %s", r.status, r.body)
	}
	logs := log.String()
	for _, msg := range []string{"the store is unavailable", "the store is available"} {
		if n := strings.Count(logs, msg); n != 1 {
			t.Errorf("%q logged %d times, want once", msg, n)
		}
	}
}
