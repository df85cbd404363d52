package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
)

// Operators name a record by the credential its caller sent; the commands
// hash it as the proxy did, with the proxy's secret.
func TestOperatorsNameRecordsByCredential(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "idem.db")
	dsn := "sqlite:" + db
	p, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: newUpstream(t, &chargeAPI{}).URL,
		Store: dsn, Migrate: true, TenantFrom: []string{"authorization,header:X-Api-Key", "cookie:session"}, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	c := client(t)
	base := "http://" + p.Addr().String() + "/v1/charges"
	send(t, c, "POST", base, "k1", `{}`, "Authorization", "Bearer alice")
	send(t, c, "POST", base, "k2", `{}`, "X-Api-Key", "k_bob")
	send(t, c, "POST", base, "k3", `{}`, "Cookie", "session=carol")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		key  string
		args []string
	}{
		{"k1", []string{"--authorization", "Bearer alice"}},
		{"k2", []string{"--tenant-credential", "header:x-api-key=k_bob"}},
		{"k3", []string{"--tenant-credential", "cookie:session=carol"}},
	} {
		out, errOut, err := run(append([]string{"inspect", "--json", "--store", dsn, "--route", "/v1/charges", tc.key}, tc.args...)...)
		var v recordView
		if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.State != "completed" || strings.Contains(v.Scope, "alice") {
			t.Errorf("inspect %s %q: %v %s%s", tc.key, tc.args, err, out, errOut)
		}
	}
	// keys list keeps a caller's records by its credential.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--authorization", "Bearer alice"}, []string{"k1"}},
		{[]string{"--tenant-credential", "cookie:session=carol", "--route", "/v1/charges"}, []string{"k3"}},
		{[]string{"--authorization", "Bearer mallory"}, nil},
		{nil, []string{"k3", "k2", "k1"}},
	} {
		if got, _ := keysOf(t, append([]string{"--store", dsn}, tc.args...)...); !slices.Equal(got, tc.want) {
			t.Errorf("keys list %q: %q, want %q", tc.args, got, tc.want)
		}
	}
	if _, errOut, err := run("keys", "list", "--store", dsn, "--authorization", "x", "--tenant", "t"); !errors.Is(err, ErrUsage) {
		t.Errorf("keys list with two tenants: %v %s", err, errOut)
	}
	// Another credential names another tenant: no record there.
	if _, _, err := run("inspect", "--store", dsn, "--route", "/v1/charges", "--authorization", "Bearer mallory", "k1"); err == nil ||
		!strings.Contains(err.Error(), "no record") {
		t.Errorf("inspect under another credential: %v", err)
	}
	// Another secret too.
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("another-secret-of-enough-bytes\n"), 0o600)
	if _, _, err := run("inspect", "--store", dsn, "--route", "/v1/charges", "--authorization", "Bearer alice",
		"--tenant-secret-file", secret, "k1"); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Errorf("inspect under another secret: %v", err)
	}
	if out, _, err := run("delete", "--store", dsn, "--route", "/v1/charges", "--authorization", "Bearer alice", "k1"); err != nil ||
		!strings.Contains(out, "deleted") {
		t.Errorf("delete: %v %s", err, out)
	}
	// Without a secret to hash with, the command says how to give one.
	_, errOut, err := run("inspect", "--store", "memory:", "--route", "/", "--authorization", "x", "k")
	if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "--tenant-secret-file") {
		t.Errorf("no secret: %v %s", err, errOut)
	}
	for _, bad := range [][]string{
		{"--authorization", "x", "--tenant", "t"},
		{"--tenant-credential", "header:X-Api-Key"},
		{"--tenant-credential", "trusted-header:X-Tenant=acme"},
	} {
		args := append([]string{"inspect", "--store", dsn, "--route", "/", "k"}, bad...)
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

// DSNs come from the flag, else the -file flag, else the environment,
// with the same meaning in every command. Not parallel: it sets the
// environment.
func TestDSNFromFileAndEnvironment(t *testing.T) {
	dir := t.TempDir()
	fromFile := filepath.Join(dir, "file.db")
	dsnFile := filepath.Join(dir, "store.dsn")
	os.WriteFile(dsnFile, []byte("  sqlite:"+fromFile+"  \nignored second line\n"), 0o600)
	if out, _, err := run("migrate", "--store-file", dsnFile); err != nil || !strings.Contains(out, "migrations applied") {
		t.Fatalf("migrate --store-file: %v %s", err, out)
	}
	if _, err := os.Stat(fromFile); err != nil {
		t.Fatalf("--store-file did not name the database: %v", err)
	}

	fromEnv := filepath.Join(dir, "env.db")
	t.Setenv(storeurl.StoreEnv, "sqlite:"+fromEnv)
	t.Setenv(storeurl.CacheEnv, "redis://127.0.0.1:1/0")
	if _, _, err := run("migrate"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fromEnv); err != nil {
		t.Fatalf("%s did not name the database: %v", storeurl.StoreEnv, err)
	}
	// An operator command reads it too: the record is looked up there.
	if _, _, err := run("inspect", "--route", "/v1/charges", "nokey"); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Errorf("inspect with %s: %v", storeurl.StoreEnv, err)
	}
	// The flag wins over the environment, the file over the environment.
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--store", "memory:"}, io.Discard)
	if err != nil || cfg.Store != "memory:" || cfg.Cache != "redis://127.0.0.1:1/0" {
		t.Errorf("proxy flags: store %q cache %q %v", cfg.Store, cfg.Cache, err)
	}
	cacheFile := filepath.Join(dir, "cache.dsn")
	os.WriteFile(cacheFile, []byte("redis://127.0.0.1:2/0\n"), 0o600)
	cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://x", "--store-file", dsnFile, "--cache-file", cacheFile}, io.Discard)
	if err != nil || cfg.Store != "sqlite:"+fromFile || cfg.Cache != "redis://127.0.0.1:2/0" {
		t.Errorf("proxy flags from files: store %q cache %q %v", cfg.Store, cfg.Cache, err)
	}

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, args := range [][]string{
		{"migrate", "--store", "memory:", "--store-file", dsnFile},
		{"migrate", "--store-file", empty},
		{"migrate", "--store-file", filepath.Join(dir, "missing")},
	} {
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// Secrets come from a file or the environment, never shorter than 16
// bytes. Not parallel: it sets the environment.
func TestProxySecretsFromFileAndEnvironment(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "tenant.secret")
	os.WriteFile(f, []byte("from-the-file-0123456789\n"), 0o600)
	t.Setenv(tenantSecretEnv, "from-the-environment-0123")
	t.Setenv(fingerprintSecretEnv, "fingerprint-secret-0123")
	cfg, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--tenant-from", "authorization", "--tenant-secret-file", f}, io.Discard)
	if err != nil || string(cfg.TenantSecret) != "from-the-file-0123456789" || string(cfg.Secret) != "fingerprint-secret-0123" {
		t.Errorf("secrets %q %q %v", cfg.TenantSecret, cfg.Secret, err)
	}
	cfg, _, _, err = parseProxyFlags([]string{"--upstream", "http://x", "--tenant-from", "authorization"}, io.Discard)
	if err != nil || string(cfg.TenantSecret) != "from-the-environment-0123" {
		t.Errorf("secret from the environment %q %v", cfg.TenantSecret, err)
	}
	t.Setenv(tenantSecretEnv, "short")
	if _, _, _, err := parseProxyFlags([]string{"--upstream", "http://x", "--tenant-from", "authorization"}, io.Discard); !errors.Is(err, ErrUsage) {
		t.Errorf("a 5-byte secret: %v", err)
	}
}
