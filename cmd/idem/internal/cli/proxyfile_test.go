package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
)

// writeConfig writes text to a config file in a temporary directory.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.json")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestProxyConfigFileRoutes(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{}
	up := newUpstream(t, api)
	path := writeConfig(t, `{
		"ttl": "5h",
		"echo-key": true,
		"methods": ["POST", "PATCH"],
		"routes": [
			{"route": "POST /login", "protected": false},
			{"route": "POST /v1/exports", "ttl": "1h", "lease-policy": "retry"},
			{"route": "POST /v1/charges", "fields": ["amount", "payment.currency"]},
			{"route": "PATCH /v1/profile/{id}", "key-required": false}
		]
	}`)
	p, base := proxyFromFlags(t, up.URL, "--config", path)
	c := client(t)
	ctx := context.Background()
	expiry := func(route, key string) time.Duration {
		t.Helper()
		rec, err := p.Store().Get(ctx, scopeOf("", "POST", route), key)
		if err != nil {
			t.Fatalf("record of %s %s: %v", route, key, err)
		}
		return rec.ExpiresAt.Sub(rec.CompletedAt)
	}

	// An unprotected route needs no key and is never replayed.
	before := api.calls.Load()
	for range 2 {
		if r := send(t, c, "POST", base+"/login", "", `{"user":"a"}`); r.status != http.StatusCreated {
			t.Fatalf("POST /login without a key: %d %s", r.status, r.body)
		}
	}
	if r := send(t, c, "POST", base+"/login", "k", `{"user":"a"}`); r.header.Get("Idempotent-Replayed") != "" ||
		r.header.Get("Idempotency-Key") != "" {
		t.Errorf("a key on an unprotected route was acted on: %v", r.header)
	}
	if n := api.calls.Load() - before; n != 3 {
		t.Errorf("upstream saw %d logins, want 3", n)
	}
	// Elsewhere a key is still required, and the file's global settings
	// hold (ttl 5h, echo-key).
	if r := send(t, c, "POST", base+"/v1/other", "", `{}`); r.status != http.StatusBadRequest {
		t.Errorf("POST /v1/other without a key: %d, want 400", r.status)
	}
	if r := send(t, c, "POST", base+"/v1/other", "o1", `{}`); r.status != http.StatusCreated || r.header.Get("Idempotency-Key") != `"o1"` {
		t.Errorf("POST /v1/other: %d, echoed key %q", r.status, r.header.Get("Idempotency-Key"))
	}
	if got := expiry("/v1/other", "o1"); got != 5*time.Hour {
		t.Errorf("/v1/other kept %v, want the file's 5h", got)
	}

	// A route with its own TTL and lease policy.
	send(t, c, "POST", base+"/v1/exports", "e1", `{}`)
	if got := expiry("/v1/exports", "e1"); got != time.Hour {
		t.Errorf("/v1/exports kept %v, want its 1h", got)
	}
	if rec, _ := p.Store().Get(ctx, scopeOf("", "POST", "/v1/exports"), "e1"); rec.LeasePolicy != "retry" {
		t.Errorf("/v1/exports lease policy %q, want retry", rec.LeasePolicy)
	}

	// A route with fields: only amount and payment.currency identify it.
	first := send(t, c, "POST", base+"/v1/charges", "c1", `{"amount":100,"payment":{"currency":"eur"},"note":"a"}`)
	same := send(t, c, "POST", base+"/v1/charges", "c1", `{"amount":100,"payment":{"currency":"eur","memo":1},"note":"b"}`)
	changed := send(t, c, "POST", base+"/v1/charges", "c1", `{"amount":100,"payment":{"currency":"usd"}}`)
	if first.status != 201 || same.header.Get("Idempotent-Replayed") != "true" || changed.status != http.StatusUnprocessableEntity {
		t.Errorf("fields route: %d, %d (replayed %q), %d", first.status, same.status, same.header.Get("Idempotent-Replayed"), changed.status)
	}

	// A route with an optional key: without one it passes, with one it is
	// protected.
	before = api.calls.Load()
	if r := send(t, c, "PATCH", base+"/v1/profile/7", "", `{"name":"x"}`); r.status != http.StatusCreated {
		t.Errorf("PATCH without a key on an optional-key route: %d", r.status)
	}
	send(t, c, "PATCH", base+"/v1/profile/7", "p1", `{"name":"x"}`)
	if r := send(t, c, "PATCH", base+"/v1/profile/7", "p1", `{"name":"x"}`); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("keyed PATCH retry on an optional-key route was not replayed: %d", r.status)
	}
	if n := api.calls.Load() - before; n != 2 {
		t.Errorf("upstream saw %d PATCHes, want 2", n)
	}
	// A request the mux would redirect (an unclean path) takes no route's
	// settings: it stays protected.
	if r := send(t, c, "POST", base+"/x/../login", "", `{}`); r.status != http.StatusBadRequest {
		t.Errorf("POST /x/../login without a key: %d, want 400", r.status)
	}
}

func TestProxyConfigFileErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ file, want string }{
		{`{"routes": [{"route": "POST /a", "tll": "1h"}]}`, `unknown field "tll"`},
		{`{"tll": "1h"}`, `unknown setting "tll"`},
		{`{"config": "other.json"}`, `unknown setting "config"`},
		{`{"routes": [{"route": "POST /v1/{id"}]}`, `route "POST /v1/{id"`},
		{`{"routes": [{"route": "POST /a"}, {"route": "POST /a"}]}`, `route "POST /a"`},
		{`{"routes": [{"protected": false}]}`, `routes[0]: no "route"`},
		{`{"routes": [{"route": "POST /a", "ttl": "-1s"}]}`, `must be positive`},
		{`{"routes": [{"route": "POST /a", "ttl": 60}]}`, `duration string`},
		{`{"routes": [{"route": "POST /a", "lease-policy": "maybe"}]}`, `route "POST /a"`},
		{`{"routes": [{"route": "POST /a", "fields": ["a~2"]}]}`, `route "POST /a"`},
		{`{"routes": [{"route": "POST /a", "protected": false, "ttl": "1h"}]}`, `takes no other setting`},
		{`{"routes": [{"route": "post /a"}]}`, `route "post /a": the method must be upper case`},
		{`{"routes": [{"route": ""}]}`, `no "route"`},
		{`{"ttl": "soon"}`, `config file`},
		{`{"ttl": {"h": 1}}`, `"ttl"`},
		{`[1, 2]`, `want a JSON object`},
		{`{} {}`, `more than one JSON value`},
	} {
		path := writeConfig(t, tt.file)
		_, errOut, err := run("proxy", "--upstream", "http://x", "--store", "memory:", "--single-tenant", "--config", path)
		if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, tt.want) {
			t.Errorf("%s: %v, want a usage error with %q:\n%s", tt.file, err, tt.want, errOut)
		}
	}
	// Routes given to NewProxy are checked alike.
	for _, rc := range []RouteConfig{
		{Pattern: "POST /a", Unprotected: true, TTL: time.Hour},
		{Pattern: "POST /a", TTL: -time.Hour},
		{Pattern: "POST /a/{x"},
	} {
		_, err := NewProxy(context.Background(), ProxyConfig{Upstream: "http://x", Store: "memory:", Listen: "127.0.0.1:0",
			SingleTenant: true, Routes: []RouteConfig{rc}})
		if err == nil || !strings.Contains(err.Error(), `route "`+rc.Pattern+`"`) {
			t.Errorf("NewProxy with route %+v: %v, want an error naming the route", rc, err)
		}
	}
	_, errOut, err := run("proxy", "--upstream", "http://x", "--config", filepath.Join(t.TempDir(), "missing.json"))
	if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "missing.json") {
		t.Errorf("a missing config file: %v\n%s", err, errOut)
	}
}

// The environment tests change the process environment: not parallel.

func TestProxySettingsPrecedence(t *testing.T) {
	path := writeConfig(t, `{"ttl": "1h", "lease": "11s", "wait": "3s", "upstream": "http://from-file"}`)
	t.Setenv("IDEM_LEASE", "22s")
	t.Setenv("IDEM_WAIT", "4s")
	t.Setenv("IDEM_CONFIG", path)
	cfg, _, _, err := parseProxyFlags([]string{"--wait", "5s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// command line > environment > config file > default.
	if cfg.Wait != 5*time.Second || cfg.Lease != 22*time.Second || cfg.TTL != time.Hour ||
		cfg.Upstream != "http://from-file" || cfg.ShutdownTimeout != 20*time.Second {
		t.Errorf("wait %v (want 5s), lease %v (want 22s), ttl %v (want 1h), upstream %q, shutdown %v",
			cfg.Wait, cfg.Lease, cfg.TTL, cfg.Upstream, cfg.ShutdownTimeout)
	}
}

func TestProxyFlagsFromEnvironment(t *testing.T) {
	api := &chargeAPI{}
	up := newUpstream(t, api)
	t.Setenv("IDEM_UPSTREAM", up.URL)
	t.Setenv("IDEM_STORE", "memory:")
	t.Setenv("IDEM_SINGLE_TENANT", "true")
	t.Setenv("IDEM_KEY_REQUIRED", "false")
	t.Setenv("IDEM_FIELDS", "amount")
	cfg, _, _, err := parseProxyFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, base := startProxy(t, cfg)
	c := client(t)
	if r := send(t, c, "POST", base+"/v1/charges", "", `{"amount":1}`); r.status != http.StatusCreated {
		t.Errorf("keyless POST with IDEM_KEY_REQUIRED=false: %d", r.status)
	}
	send(t, c, "POST", base+"/v1/charges", "k", `{"amount":1,"note":"a"}`)
	if r := send(t, c, "POST", base+"/v1/charges", "k", `{"amount":1,"note":"b"}`); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("IDEM_FIELDS=amount: a change of note was not replayed: %d", r.status)
	}
	if n := api.calls.Load(); n != 2 {
		t.Errorf("upstream called %d times, want 2", n)
	}

	// An invalid value names its variable.
	t.Setenv("IDEM_TTL", "soon")
	_, errOut, err := run("proxy")
	if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "$IDEM_TTL") || !strings.Contains(errOut, "--ttl") {
		t.Errorf("IDEM_TTL=soon: %v\n%s", err, errOut)
	}
	// Every command reads its flags from the environment.
	t.Setenv("IDEM_BATCH", "many")
	_, errOut, err = run("sweep")
	if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "$IDEM_BATCH") {
		t.Errorf("sweep with IDEM_BATCH=many: %v\n%s", err, errOut)
	}
}

func TestStoreFileOnCommandLineBeatsStoreEnv(t *testing.T) {
	if envName("store") != storeurl.StoreEnv || envName("cache") != storeurl.CacheEnv {
		t.Fatalf("--store and --cache read %s and %s, the documented variables are %s and %s",
			envName("store"), envName("cache"), storeurl.StoreEnv, storeurl.CacheEnv)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "dsn")
	if err := os.WriteFile(file, []byte("memory:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IDEM_STORE", "sqlite:"+filepath.Join(dir, "from-env.db"))
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--store-file", file}, io.Discard)
	if err != nil || cfg.Store != "memory:" {
		t.Errorf("--store-file with IDEM_STORE set: store %q, %v; want the file's memory:", cfg.Store, err)
	}
	cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://x"}, io.Discard)
	if err != nil || cfg.Store != "sqlite:"+filepath.Join(dir, "from-env.db") {
		t.Errorf("IDEM_STORE alone: store %q, %v", cfg.Store, err)
	}
	t.Setenv("IDEM_STORE_FILE", file)
	cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://x", "--store", "sqlite:x.db"}, io.Discard)
	if err != nil || cfg.Store != "sqlite:x.db" {
		t.Errorf("--store with IDEM_STORE_FILE set: store %q, %v; want the command line's", cfg.Store, err)
	}
}

func TestHelpNamesTheEnvironmentVariables(t *testing.T) {
	t.Parallel()
	out, _, err := run("help", "proxy")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--max-body size  ($IDEM_MAX_BODY)", "--config file  ($IDEM_CONFIG)",
		"--store-server-errors  ($IDEM_STORE_SERVER_ERRORS)", `"routes"`, "the command line wins"} {
		if !strings.Contains(out, want) {
			t.Errorf("idem help proxy lacks %q", want)
		}
	}
}

// The config files of the docs are ones the proxy accepts: the full
// example of docs/proxy.md, and every other JSON snippet with routes.
func TestDocsConfigExamples(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("../../../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(string(text), -1) {
			if !strings.Contains(m[1], `"routes"`) {
				continue
			}
			n++
			// A snippet of routes alone is read with the rest given on the
			// command line, which wins over the file; so is the secret the
			// file names, which lives on the server the docs speak of.
			secret := filepath.Join(t.TempDir(), "tenant.secret")
			if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, _, _, err := parseProxyFlags([]string{"--config", writeConfig(t, m[1]),
				"--upstream", "http://127.0.0.1:3000", "--tenant-from", "authorization", "--tenant-secret-file", secret}, io.Discard)
			if err != nil {
				t.Errorf("%s: the config file %s: %v", page, m[1], err)
			}
			if strings.Contains(m[1], `"echo-key": true`) && (len(cfg.Routes) < 5 || !cfg.EchoKey) {
				t.Errorf("%s: the config file read as %+v", page, cfg)
			}
		}
	}
	if n < 2 {
		t.Errorf("%d config files with routes in docs/, want the proxy page's and the async page's", n)
	}
}
