// Package pgcluster runs private PostgreSQL servers for the tests that
// crash, stop, fail over or otherwise disturb a database: initdb into a
// temporary directory, a port of their own, never the shared server.
//
// initdb and postgres refuse to run as root: as root, every PostgreSQL
// command runs through `runuser -u postgres --`, in a directory owned by
// postgres. A test is skipped (failed under CI=true, see testenv.Skip) when
// PostgreSQL's server binaries are not installed.
package pgcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// Cluster is a private PostgreSQL server of one test.
type Cluster struct {
	// Port is the server's port: chosen by StartOnFreePort, or set by the
	// test before Start.
	Port int
	bin  string // the directory of initdb, pg_ctl, postgres
	dir  string // the socket directory; data/ and log inside
	// asPostgres prefixes every command: `runuser -u postgres --` as root.
	asPostgres []string
	// opts are more server options, in pg_ctl -o form.
	opts string
}

// Start creates and starts a cluster, removed when the test ends, with
// opts added to the server's options (pg_ctl -o form).
func Start(t *testing.T, opts string) *Cluster {
	t.Helper()
	c := Init(t, opts)
	c.StartOnFreePort(t)
	return c
}

// Init creates a cluster with initdb, not started, removed (with its
// server stopped) when the test ends.
func Init(t *testing.T, opts string) *Cluster {
	t.Helper()
	c := New(t, opts)
	if out, err := c.Command("initdb", "-D", c.DataDir(), "-U", "postgres",
		"--auth=trust", "-N", "-E", "UTF8", "--locale=C").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	return c
}

// New makes the directory of a cluster, removed (with the server stopped)
// when the test ends; nothing is created or started yet (pg_basebackup
// fills DataDir for a standby).
func New(t *testing.T, opts string) *Cluster {
	t.Helper()
	bin := binDir()
	if bin == "" {
		testenv.Skip(t, "initdb and pg_ctl not found (PATH, /usr/lib/postgresql/*/bin): no private PostgreSQL")
	}
	dir, err := os.MkdirTemp("", "idem-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{bin: bin, dir: dir, opts: opts}
	t.Cleanup(func() {
		c.Pgctl("stop", "-m", "immediate")
		os.RemoveAll(dir)
	})
	if os.Geteuid() == 0 {
		// The server refuses root: the cluster belongs to postgres.
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Skip(t, "running as root without a postgres user: PostgreSQL refuses to run as root")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.asPostgres = []string{"runuser", "-u", "postgres", "--"}
	}
	return c
}

// InitOnFreePort creates a cluster as Init does and gives it a free port,
// for a test that names the server's URL before starting it.
func InitOnFreePort(t *testing.T, opts string) *Cluster {
	t.Helper()
	c := Init(t, opts)
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c.Port = port
	return c
}

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return filepath.Join(c.dir, "data") }

// Log returns the server's log so far.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "log"))
	return string(b)
}

// StartOnFreePort starts the server on a free port, probed; another
// process may take it before the server binds, so a failed start tries
// another.
func (c *Cluster) StartOnFreePort(t *testing.T) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		var err error
		if c.Port, err = FreePort(); err != nil {
			t.Fatal(err)
		}
		if err = c.Start(); err == nil {
			return
		}
		if attempt == 2 {
			t.Fatalf("starting the private PostgreSQL: %v\n%s", err, c.Log())
		}
	}
}

// Start starts the server on Port and waits until it accepts connections.
// fsync is off: the faults here crash processes, never the machine, and
// the page cache survives a process crash.
func (c *Cluster) Start() error {
	return c.Pgctl("start", "-w", "-t", "120", "-l", filepath.Join(c.dir, "log"), "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 %s", c.Port, c.dir, c.opts))
}

// Stop stops the server with a fast shutdown, and waits for it.
func (c *Cluster) Stop() error { return c.Pgctl("stop", "-m", "fast", "-w") }

// Crash stops the server as a crash would: immediate mode kills every
// backend at once, with no checkpoint; the next start runs crash recovery.
func (c *Cluster) Crash() error { return c.Pgctl("stop", "-m", "immediate", "-w") }

// Pgctl runs pg_ctl on the cluster's data directory.
func (c *Cluster) Pgctl(args ...string) error {
	out, err := c.Command("pg_ctl", append([]string{"-D", c.DataDir()}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Psql runs one query and returns its output, unaligned, without headers.
func (c *Cluster) Psql(query string) (string, error) {
	out, err := c.Command("psql", "-h", c.dir, "-p", strconv.Itoa(c.Port), "-U", "postgres", "-d", "postgres", "-Atc", query).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Command is one of PostgreSQL's programs (initdb, pg_ctl, psql,
// pg_basebackup), run as the cluster's owner in its directory.
func (c *Cluster) Command(tool string, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), c.asPostgres...), filepath.Join(c.bin, tool)), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = c.dir
	return cmd
}

// DSN is the URL of the cluster's database postgres.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// Pair is a private primary and its streaming standby.
type Pair struct{ Primary, Standby *Cluster }

// StartPair starts a primary and a standby cloned from it with
// pg_basebackup -R, streaming from it. With synchronous, the primary's
// commits wait for the standby (synchronous_standby_names '*',
// synchronous_commit on); the standby does not inherit the setting (it is
// a server option of the primary only), so once promoted, alone, it does
// not wait for a standby it no longer has.
func StartPair(t *testing.T, synchronous bool) *Pair {
	t.Helper()
	opts := ""
	if synchronous {
		opts = "-c synchronous_standby_names='*' -c synchronous_commit=on"
	}
	p := &Pair{Primary: Start(t, opts)}
	p.Standby = New(t, "")
	if out, err := p.Standby.Command("pg_basebackup", "-D", p.Standby.DataDir(), "-R", "-X", "stream",
		"-h", "127.0.0.1", "-p", strconv.Itoa(p.Primary.Port), "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	p.Standby.StartOnFreePort(t)
	p.WaitStreaming(t, 60*time.Second)
	return p
}

// WaitStreaming waits until the standby streams from the primary, as a
// synchronous standby when the primary's commits wait for one.
func (p *Pair) WaitStreaming(t *testing.T, timeout time.Duration) {
	t.Helper()
	want := "streaming"
	if strings.Contains(p.Primary.opts, "synchronous_standby_names") {
		want = "streaming sync"
	}
	deadline := time.Now().Add(timeout)
	for {
		out, err := p.Primary.Psql("SELECT state || CASE WHEN sync_state = 'sync' THEN ' sync' ELSE '' END FROM pg_stat_replication")
		if err == nil && out == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby is not %q after %v: %q %v", want, timeout, out, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StopStandby stops the standby until the test ends, then starts it again
// and waits until it streams: the primary's commits wait meanwhile when
// they wait for a synchronous standby.
func (p *Pair) StopStandby(t *testing.T) {
	t.Helper()
	if err := p.Standby.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Standby.Start(); err != nil {
			t.Fatalf("restarting the standby: %v\n%s", err, p.Standby.Log())
		}
		p.WaitStreaming(t, time.Minute)
	})
}

// DSN is the multi-host URL of the pair: whichever accepts writes.
func (p *Pair) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		p.Primary.Port, p.Standby.Port)
}

// FreePort returns a TCP port free on 127.0.0.1 when it was probed.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// binDir is the directory of the newest PostgreSQL server programs.
func binDir() string {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "initdb")); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Strings(dirs)
	for i := len(dirs) - 1; i >= 0; i-- { // the newest version
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i]
		}
	}
	return ""
}
