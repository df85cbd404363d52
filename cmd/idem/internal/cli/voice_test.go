package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// runMain runs the binary as main does and returns its stderr and exit
// status.
func runMain(args ...string) (stderr string, code int) {
	var o, e bytes.Buffer
	code = Main(context.Background(), args, &o, &e)
	return e.String(), code
}

// leaks are what an error line must never show a user: Go's own words
// for a refused value, Go type names and source paths.
var leaks = []string{"parse error", "Go value", "cli.", "registered at", ".go:", "storeurl:",
	"flag provided but not defined", "idem: proxy:", "json:"}

// checkVoice fails unless the first line of stderr is the error of the
// command cmd under its one prefix, says want, and leaks nothing.
func checkVoice(t *testing.T, stderr, cmd string, want ...string) {
	t.Helper()
	first, _, _ := strings.Cut(stderr, "\n")
	if !strings.HasPrefix(first, "idem "+cmd+": ") {
		t.Errorf("first line %q does not start with %q", first, "idem "+cmd+": ")
	}
	for _, w := range want {
		if !strings.Contains(first, w) {
			t.Errorf("first line %q does not say %q", first, w)
		}
	}
	for _, l := range leaks {
		if strings.Contains(stderr, l) {
			t.Errorf("stderr shows %q:\n%s", l, stderr)
		}
	}
}

func TestMistypedFlagHint(t *testing.T) {
	t.Parallel()
	stderr, code := runMain("proxy", "--upstrem", "http://127.0.0.1:1", "--store", "memory:")
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	checkVoice(t, stderr, "proxy", "unknown flag --upstrem", "did you mean --upstream?")

	stderr, _ = runMain("keys", "list", "--rout", "/v1/charges")
	checkVoice(t, stderr, "keys list", "did you mean --route?")

	// Nothing close: no guess.
	stderr, code = runMain("proxy", "--xyzzy")
	checkVoice(t, stderr, "proxy", "unknown flag --xyzzy")
	if code != 2 || strings.Contains(stderr, "did you mean") {
		t.Errorf("exit %d, stderr %q: want 2 and no hint", code, stderr)
	}
}

func TestOnePrefix(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"proxy", []string{"proxy", "--single-tenant", "--upstream", "http://127.0.0.1:1", "--store", "bogus:x"}, "unsupported store DSN"},
		{"proxy", []string{"proxy", "--upstream", "http://127.0.0.1:1", "--store", "memory:"}, "no tenant source"},
		{"inspect", []string{"inspect", "--store", "sqlite:" + filepath.Join(dir, "none.db"), "--route", "/v1/charges", "k"}, "none.db"},
		{"reap", []string{"reap", "--store", "bogus:x"}, "unsupported store DSN"},
	} {
		stderr, code := runMain(c.args...)
		if code == 0 {
			t.Errorf("%q: exit 0", c.args)
		}
		checkVoice(t, stderr, c.cmd, c.want)
	}
}

func TestTypedValueErrors(t *testing.T) {
	// t.Setenv: not parallel.
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	base := []string{"proxy", "--single-tenant", "--upstream", "http://127.0.0.1:1", "--store", "memory:", "--listen", "127.0.0.1:0"}
	for _, c := range []struct {
		name string
		file string
		want []string
	}{
		{"ttl number", `{"ttl": 24}`, []string{"ttl.json", "--ttl", "a duration such as 24h"}},
		{"echo-key string", `{"echo-key": "yes"}`, []string{"echo-key.json", "--echo-key", "true, false"}},
		{"routes object", `{"routes": {"route": "POST /v1/charges"}}`, []string{"routes", "got a JSON object, want a list"}},
		{"route member type", `{"routes": [{"route": "POST /v1/charges", "key-required": "yes"}]}`, []string{"routes[0]", `"key-required"`, "true or false"}},
		{"route ttl number", `{"routes": [{"route": "POST /v1/charges", "ttl": 24}]}`, []string{"routes[0]", "24", "duration"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := write(strings.SplitN(c.want[0], " ", 2)[0], c.file)
			stderr, code := runMain(append(base, "--config", path)...)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			checkVoice(t, stderr, "proxy", c.want...)
		})
	}

	t.Run("environment", func(t *testing.T) {
		t.Setenv("IDEM_TTL", "soon")
		stderr, code := runMain(base...)
		if code != 2 {
			t.Errorf("exit %d, want 2", code)
		}
		checkVoice(t, stderr, "proxy", `"soon"`, "$IDEM_TTL", "--ttl", "a duration such as 24h")
	})
	t.Run("command line", func(t *testing.T) {
		stderr, _ := runMain(append(base, "--ttl", "soon")...)
		checkVoice(t, stderr, "proxy", `"soon"`, "--ttl", "a duration such as 24h")
		stderr, _ = runMain("reap", "--batch", "many")
		checkVoice(t, stderr, "reap", `"many"`, "--batch", "a whole number")
	})
	t.Run("conflicting patterns", func(t *testing.T) {
		stderr, code := runMain(append(base, "--async", "POST /a", "--async", "POST  /a")...)
		if code == 0 {
			t.Errorf("exit 0")
		}
		checkVoice(t, stderr, "proxy", "conflicts")
	})
}

// TestExitStatuses pins the one rule: 0 success, 2 a usage error (the
// command line or configuration is refused), 1 any other failure; and
// every command's help says so.
func TestExitStatuses(t *testing.T) {
	t.Parallel()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"version"}, 0},
		{[]string{"migrate", "--store", dsn}, 0},
		{[]string{}, 2},
		{[]string{"nosuch"}, 2},
		{[]string{"proxy", "--upstrem", "http://127.0.0.1:1"}, 2},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--store", "memory:"}, 2},                                                      // no tenant source
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--store", "memory:", "--single-tenant", "--tenant-from", "authorization"}, 2}, // exclusive
		{[]string{"inspect", "--store", dsn, "--route", "/v1/charges", "absent"}, 1},
		// A DSN that names no store is a refused configuration.
		{[]string{"inspect", "--store", "bogus", "--route", "/v1/charges", "k"}, 2},
		{[]string{"sweep", "--store", "nosuch://x"}, 2},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--single-tenant", "--store", "mysql://u:p@h:bad/db"}, 2},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--single-tenant", "--store", "memory:", "--cache", "memory:"}, 2},
		{[]string{"bench", "--keys", "1"}, 2}, // no URL
	} {
		if _, code := runMain(c.args...); code != c.want {
			t.Errorf("idem %s: exit %d, want %d", strings.Join(c.args, " "), code, c.want)
		}
	}
	for _, path := range commandPaths() {
		var out bytes.Buffer
		if err := Run(context.Background(), append([]string{"help"}, strings.Fields(path)...), &out, &out); err != nil {
			t.Fatalf("help %s: %v", path, err)
		}
		if !strings.Contains(out.String(), "\nExit status:\n  0  ") || !strings.Contains(out.String(), "\n  2  ") {
			t.Errorf("idem help %s does not document exit statuses 0 and 2:\n%s", path, out.String())
		}
	}
}

// Without the tenant, inspect, delete and reconcile resolve name the
// tenants that have a record of the key for the route.
func TestNotFoundNamesTenants(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	record(t, s, "t1", "/v1/charges", "order-42", store.StateUnknown)
	record(t, s, "t2", "/v1/refunds", "order-42", store.StateUnknown)
	for _, args := range [][]string{
		{"inspect", "--store", dsn, "--route", "/v1/charges", "order-42"},
		{"delete", "--store", dsn, "--route", "/v1/charges", "order-42"},
		{"reconcile", "resolve", "--store", dsn, "--route", "/v1/charges", "--retryable", "--fence", "1", "order-42"},
	} {
		stderr, code := runMain(args...)
		if code != 1 {
			t.Errorf("%q: exit %d, want 1", args, code)
		}
		if !strings.Contains(stderr, `no record for key "order-42"`) || !strings.Contains(stderr, `under tenant "t1": give it with --tenant`) ||
			strings.Contains(stderr, `"t2"`) {
			t.Errorf("%q: %s, want the tenant t1 (and not t2, another route) named", args, stderr)
		}
	}
}
