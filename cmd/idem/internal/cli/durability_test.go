package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// The store's durability check, on a real PostgreSQL: a session whose
// commits are not flushed (synchronous_commit=off, set in the URL as any
// role or database setting would) is at risk. Without the strict flag the
// proxy serves and logs the warning (what can happen, how to fix it) and
// the metric says at_risk; with --require-synchronous-replication protected
// requests get 503 store-not-durable with Retry-After, nothing reaches the
// upstream, and /readyz is not ready. With the server's defaults the strict
// proxy serves.
func TestProxyRequireSynchronousReplication(t *testing.T) {
	t.Parallel()
	u, _ := pgStore(t)
	q := u.Query()
	q.Set("synchronous_commit", "off")
	u.RawQuery = q.Encode()
	atRiskURL := u.String()
	q.Del("synchronous_commit")
	u.RawQuery = q.Encode()
	safeURL := u.String()

	api := &chargeAPI{}
	up := newUpstream(t, api).URL
	c := client(t)

	var log safeBuffer
	p, base := startProxy(t, ProxyConfig{Upstream: up, Store: atRiskURL, Admin: "127.0.0.1:0", Logger: log.logger()})
	if r := send(t, c, "POST", base+"/v1/charges", "lax", `{}`); r.status != http.StatusCreated {
		t.Fatalf("without the strict flag: %d %s", r.status, r.body)
	}
	if !strings.Contains(log.String(), "can be lost") || !strings.Contains(log.String(), "set synchronous_commit = on") {
		t.Errorf("no warning saying what can happen and how to fix it:\n%s", log.String())
	}
	metrics := send(t, c, "GET", "http://"+p.AdminAddr().String()+"/metrics", "", "")
	if !metricLine(string(metrics.body), "idem_store_durability{", `state="at_risk"`, " 1") ||
		!metricLine(string(metrics.body), "idem_store_durability{", `state="safe"`, " 0") {
		t.Errorf("idem_store_durability does not say at_risk:\n%s", grepLines(string(metrics.body), "idem_store_"))
	}

	calls := api.calls.Load()
	p, base = startProxy(t, ProxyConfig{Upstream: up, Store: atRiskURL, Admin: "127.0.0.1:0", Config: idem.Config{RequireDurable: true}})
	r := send(t, c, "POST", base+"/v1/charges", "strict", `{}`)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" ||
		problemType(t, r) != idem.ProblemBase+idem.SlugStoreNotDurable {
		t.Fatalf("strict proxy on an at-risk store: %d %v %s, want 503 store-not-durable with Retry-After", r.status, r.header, r.body)
	}
	if api.calls.Load() != calls {
		t.Fatal("the upstream was called while the strict proxy refused")
	}
	if r := send(t, c, "GET", base+"/v1/charges", "", ""); r.status != http.StatusCreated {
		t.Errorf("an unprotected request through the strict proxy: %d", r.status)
	}
	ready := send(t, c, "GET", "http://"+p.AdminAddr().String()+"/readyz", "", "")
	if ready.status != http.StatusServiceUnavailable || !strings.Contains(string(ready.body), "durability") ||
		strings.Contains(string(ready.body), "synchronous_commit") {
		t.Errorf("readyz of the strict proxy: %d %s, want 503 naming durability in general terms", ready.status, ready.body)
	}

	_, base = startProxy(t, ProxyConfig{Upstream: up, Store: safeURL, Config: idem.Config{RequireDurable: true}})
	if r := send(t, c, "POST", base+"/v1/charges", "strict-safe", `{}`); r.status != http.StatusCreated {
		t.Errorf("strict proxy on a server with commits flushed and no standby: %d %s", r.status, r.body)
	}
}

// metricLine reports whether one line of a Prometheus exposition starts
// with prefix and contains every part.
func metricLine(exposition, prefix string, parts ...string) bool {
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// The strict flag comes from the command line, the environment and the
// config file like every flag, and is refused at start with a store that
// cannot check its replication.
func TestRequireSynchronousReplicationFlag(t *testing.T) {
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--single-tenant", "--require-synchronous-replication"}, io.Discard)
	if err != nil || !cfg.RequireDurable {
		t.Fatalf("command line: %v %v", cfg.RequireDurable, err)
	}
	t.Setenv("IDEM_REQUIRE_SYNCHRONOUS_REPLICATION", "true")
	if cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://x", "--single-tenant"}, io.Discard); err != nil || !cfg.RequireDurable {
		t.Fatalf("environment: %v %v", cfg.RequireDurable, err)
	}
	os.Unsetenv("IDEM_REQUIRE_SYNCHRONOUS_REPLICATION")
	file := filepath.Join(t.TempDir(), "idem.json")
	if err := os.WriteFile(file, []byte(`{"upstream":"http://x","single-tenant":true,"require-synchronous-replication":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, _, _, err = parseProxyFlags([]string{"--config", file}, io.Discard); err != nil || !cfg.RequireDurable {
		t.Fatalf("config file: %v %v", cfg.RequireDurable, err)
	}
	_, err = NewProxy(context.Background(), ProxyConfig{
		Upstream:     "http://x",
		Store:        "sqlite:" + filepath.Join(t.TempDir(), "idem.db"),
		Listen:       "127.0.0.1:0",
		SingleTenant: true,
		Config:       idem.Config{RequireDurable: true},
	})
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--require-synchronous-replication") {
		t.Errorf("strict flag with SQLite: %v, want a usage error naming the flag", err)
	}
}
