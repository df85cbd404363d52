package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/store"
)

// run runs the binary's command line in process.
func run(args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = Run(context.Background(), args, &o, &e)
	return o.String(), e.String(), err
}

func TestMigrateInspectDelete(t *testing.T) {
	t.Parallel()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")

	out, _, err := run("migrate", "--store", dsn)
	if err != nil || !strings.Contains(out, "migrations applied") {
		t.Fatalf("migrate: %q %v", out, err)
	}
	if out, _, err = run("migrate", "--store", dsn); err != nil { // again: a no-op
		t.Fatalf("migrate twice: %q %v", out, err)
	}

	// Make a record the way production does: through the proxy.
	up := newUpstream(t, &chargeAPI{})
	p, err := NewProxy(context.Background(), ProxyConfig{Listen: "127.0.0.1:0", Upstream: up.URL, Store: dsn, SingleTenant: true, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	first := send(t, client(t), "POST", "http://"+p.Addr().String()+"/v1/charges", "order-1", `{"amount":100}`,
		"X-Tenant-ID", "acme")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The proxy ran without --tenant-header: no Authorization, tenant "".
	out, _, err = run("inspect", "--json", "--store", dsn, "--route", "/v1/charges", "order-1")
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	var v recordView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("inspect printed %q: %v", out, err)
	}
	if v.Scope != "0:POST /v1/charges" || v.Key != "order-1" || v.State != store.StateCompleted || v.Fence <= 0 ||
		v.Fingerprint == "" || v.Response == nil || v.Response.Status != http.StatusCreated ||
		v.Response.BodyLength != len(first.body) || v.CreatedAt == nil || v.CompletedAt == nil || v.ExpiresAt == nil {
		t.Errorf("inspect: %s", out)
	}
	for _, field := range []string{`"state"`, `"fence"`, `"fingerprint"`, `"last_error"`, `"created_at"`, `"body_length"`, `"status"`} {
		if !strings.Contains(out, field) {
			t.Errorf("inspect output lacks %s", field)
		}
	}

	// A raw scope, flags after the key, names the same record.
	if out2, _, err := run("inspect", `"order-1"`, "--json", "--store", dsn, "--scope", "0:POST /v1/charges"); err != nil || out2 != out {
		t.Errorf("inspect by scope: %v\n%s", err, out2)
	}
	if _, _, err := run("inspect", "--store", dsn, "--route", "/v1/charges", "--method", "patch", "order-1"); err == nil {
		t.Error("inspect found a PATCH record that does not exist")
	}

	out, _, err = run("delete", "--store", dsn, "--tenant", "", "--method", "POST", "--route", "/v1/charges", "order-1")
	if err != nil || !strings.Contains(out, fmt.Sprintf("it was completed (201), fence %d", v.Fence)) {
		t.Fatalf("delete: %q %v, want what went: completed (201), fence %d", out, err, v.Fence)
	}
	if _, _, err := run("inspect", "--store", dsn, "--scope", "0:POST /v1/charges", "order-1"); err == nil ||
		!strings.Contains(err.Error(), "no record") {
		t.Errorf("inspect after delete: %v", err)
	}
	if _, _, err := run("delete", "--store", dsn, "--scope", "0:POST /v1/charges", "order-1"); err == nil ||
		!strings.Contains(err.Error(), "no record") {
		t.Errorf("delete twice: %v", err)
	}

	// A deleted key runs again: the operator's cache-bust.
	s, err := storeurl.Open(context.Background(), dsn, storeurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get(context.Background(), "0:POST /v1/charges", "order-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record still there: %v", err)
	}
}

func TestRecordCommandErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := "sqlite:" + filepath.Join(dir, "nope.db")
	if _, _, err := run("inspect", "--store", missing, "--scope", "s", "k"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("inspect on a missing file: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "nope.db*")); len(m) != 0 {
		t.Errorf("inspect created %v", m)
	}
	usage := [][]string{
		{"inspect", "--store", "memory:"},                                      // no key
		{"inspect", "--store", "memory:", "--scope", "s", "k1", "k2"},          // two keys
		{"inspect", "--store", "memory:", "k"},                                 // no scope or route
		{"delete", "--store", "memory:", "--scope", "s", "--route", "/x", "k"}, // both
		{"migrate", "extra"},
		{"inspect", "--bogus"},
	}
	for _, args := range usage {
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want ErrUsage", args, err)
		}
	}
	if _, _, err := run("inspect", "--store", "memory:", "--scope", "s", "k"); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Errorf("inspect on an empty memory store: %v", err)
	}
	// A DSN that names no store is a refused configuration: exit status 2.
	if _, _, err := run("migrate", "--store", "nosql://x"); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "unsupported store DSN") {
		t.Errorf("migrate with an unsupported DSN: %v, want a usage error", err)
	}
	if out, _, err := run("migrate", "--store", "memory:"); err != nil || !strings.Contains(out, "nothing to migrate") {
		t.Errorf("migrate memory: %q %v", out, err)
	}
}

func TestRunUsage(t *testing.T) {
	t.Parallel()
	out, _, err := run("help")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"proxy", "migrate", "inspect", "delete", "help"} {
		if !strings.Contains(out, "  "+c+" ") {
			t.Errorf("usage does not list %s:\n%s", c, out)
		}
	}
	if _, e, err := run(); !errors.Is(err, ErrUsage) || !strings.Contains(e, "Commands:") {
		t.Errorf("no arguments: %v\n%s", err, e)
	}
	if _, e, err := run("frobnicate"); !errors.Is(err, ErrUsage) || !strings.Contains(e, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %v\n%s", err, e)
	}
	if out, _, err := run("help", "inspect"); err != nil || !strings.Contains(out, "--route") && !strings.Contains(out, "-route") {
		t.Errorf("help inspect: %v\n%s", err, out)
	}
	if _, _, err := run("proxy", "-h"); err != nil {
		t.Errorf("proxy -h: %v", err)
	}
	if _, e, err := run("proxy"); !errors.Is(err, ErrUsage) || !strings.Contains(e, "--upstream is required") {
		t.Errorf("proxy without upstream: %v\n%s", err, e)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestDeleteRefusesInProgress(t *testing.T) {
	t.Parallel()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	s, err := storeurl.Open(context.Background(), dsn, storeurl.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Reserve(context.Background(), store.ReserveParams{Scope: "0:POST /v1/charges", Key: "busy",
		Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := run("delete", "--store", dsn, "--route", "/v1/charges", "busy"); err == nil ||
		!strings.Contains(err.Error(), "in progress") {
		t.Fatalf("delete of an in-progress record: %v", err)
	}
	if _, _, err := run("inspect", "--store", dsn, "--route", "/v1/charges", "busy"); err != nil {
		t.Fatalf("the refused delete removed the record: %v", err)
	}
}

// A delete decided about one execution never removes the next: the record
// the operator looked at was settled, run again and answered since; idem
// delete --fence with the fence they were shown fails and keeps the
// answer, which the next retry replays instead of running the request
// again.
func TestDeleteBoundToFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	shown := unknownRecord(t, s, "paid")
	if err := s.Resolve(ctx, store.ResolveParams{FenceParams: shown, To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	fence := reserve(t, s, "paid", time.Minute, store.LeaseUnknown) // the retry runs again
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: testScope, Key: "paid", Fence: fence},
		Response: store.Response{Status: 201, Body: []byte(`{"id":"ch_2"}`)}}); err != nil {
		t.Fatal(err)
	}
	answered, err := s.Get(ctx, testScope, "paid")
	if err != nil || answered.Fence == shown.Fence {
		t.Fatalf("the retry: fence %d (was %d), %v", answered.Fence, shown.Fence, err)
	}

	out, _, err := run("delete", "--store", dsn, "--scope", testScope, "--fence", fmt.Sprint(shown.Fence), "paid")
	if err == nil || errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "ran again") ||
		!strings.Contains(err.Error(), fmt.Sprint(answered.Fence)) || strings.Contains(out, "deleted key") {
		t.Fatalf("delete with the fence of an older execution: %q %v", out, err)
	}
	if rec, err := s.Get(ctx, testScope, "paid"); err != nil || rec.State != store.StateCompleted || rec.Fence != answered.Fence {
		t.Fatalf("after the refused delete: %+v %v", rec, err)
	}

	for _, bad := range []string{"0", "-1"} {
		if _, _, err := run("delete", "--store", dsn, "--scope", testScope, "--fence", bad, "paid"); !errors.Is(err, ErrUsage) {
			t.Errorf("--fence %s: %v, want ErrUsage", bad, err)
		}
	}
	if out, _, err := run("delete", "--store", dsn, "--scope", testScope, "--fence", fmt.Sprint(answered.Fence), "paid"); err != nil ||
		!strings.Contains(out, fmt.Sprintf("deleted key %q in scope %q: it was completed (201), fence %d", "paid", testScope, answered.Fence)) {
		t.Fatalf("delete with the record's fence: %q %v", out, err)
	}
	if _, err := s.Get(ctx, testScope, "paid"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete with the record's fence: %v", err)
	}
}
