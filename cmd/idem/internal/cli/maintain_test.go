package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/store"
)

const testScope = "0:POST /v1/charges"

// seeded opens the SQLite store at dsn (migrated) whose clock reads at, so
// a test makes records that are already past their lease or expiry for the
// commands, which run on the real clock. The store closes with the test.
func seeded(t *testing.T, dsn string, at time.Time) store.Store {
	t.Helper()
	s, err := storeurl.Open(context.Background(), dsn, storeurl.Options{Migrate: true, Clock: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// reserve makes an in-progress record and returns its fence.
func reserve(t *testing.T, s store.Store, key string, lease time.Duration, policy store.LeasePolicy) int64 {
	t.Helper()
	res, err := s.Reserve(context.Background(), store.ReserveParams{
		Scope: testScope, Key: key, Fingerprint: "fp-" + key, Lease: lease, TTL: time.Hour, LeasePolicy: policy,
	})
	if err != nil || !res.Outcome.Acquired() {
		t.Fatalf("reserve %s: %v %v", key, res.Outcome, err)
	}
	return res.Record.Fence
}

// unknownRecord makes an unknown record, due for reconciliation now.
// unknownRecord leaves key's record unknown and returns its fence.
func unknownRecord(t *testing.T, s store.Store, key string) store.FenceParams {
	t.Helper()
	fence := store.FenceParams{Scope: testScope, Key: key, Fence: reserve(t, s, key, time.Minute, store.LeaseUnknown)}
	if err := s.MarkUnknown(context.Background(), store.ReleaseParams{FenceParams: fence, Error: "upstream hung up"}); err != nil {
		t.Fatal(err)
	}
	return fence
}

func completedRecord(t *testing.T, s store.Store, key string, ttl time.Duration) {
	t.Helper()
	fence := reserve(t, s, key, time.Minute, store.LeaseUnknown)
	err := s.Complete(context.Background(), store.CompleteParams{
		FenceParams: store.FenceParams{Scope: testScope, Key: key, Fence: fence},
		Response:    store.Response{Status: 201, Body: []byte(`{}`)}, TTL: ttl,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func stateOf(t *testing.T, s store.Store, key string) store.State {
	t.Helper()
	rec, err := s.Get(context.Background(), testScope, key)
	if errors.Is(err, store.ErrNotFound) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

func tempDSN(t *testing.T) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
}

func TestSweepCommand(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	past := seeded(t, dsn, time.Now().Add(-time.Hour))
	reserve(t, past, "dead-1", time.Second, store.LeaseUnknown)
	reserve(t, past, "dead-2", time.Second, store.LeaseUnknown)
	reserve(t, past, "dead-retry", time.Second, store.LeaseRetry)
	reserve(t, seeded(t, dsn, time.Now()), "alive", time.Hour, store.LeaseUnknown)

	// A batch of 1 makes the pass loop until nothing is left.
	out, errOut, err := run("sweep", "--store", dsn, "--batch", "1")
	if err != nil || out != "swept 2 expired lease(s) to unknown\n" {
		t.Fatalf("sweep: %q %v\n%s", out, err, errOut)
	}
	if !strings.Contains(errOut, "zombie lease swept") || !strings.Contains(errOut, "dead-1") {
		t.Errorf("sweep did not log the swept records:\n%s", errOut)
	}
	for key, want := range map[string]store.State{
		"dead-1": store.StateUnknown, "dead-2": store.StateUnknown,
		"dead-retry": store.StateInProgress, "alive": store.StateInProgress,
	} {
		if got := stateOf(t, past, key); got != want {
			t.Errorf("%s: %s, want %s", key, got, want)
		}
	}
	if out, _, err := run("sweep", "--store", dsn); err != nil || !strings.HasPrefix(out, "swept 0 ") {
		t.Errorf("second sweep: %q %v", out, err)
	}
}

func TestReapCommand(t *testing.T) {
	t.Parallel()
	for _, soft := range []bool{false, true} {
		t.Run(map[bool]string{false: "delete", true: "soft"}[soft], func(t *testing.T) {
			t.Parallel()
			dsn := tempDSN(t)
			old := seeded(t, dsn, time.Now().Add(-48*time.Hour))
			completedRecord(t, old, "old", time.Hour)
			unknownRecord(t, old, "forgotten") // unknown past its expiry: abandoned
			completedRecord(t, seeded(t, dsn, time.Now()), "fresh", 24*time.Hour)

			args := []string{"reap", "--store", dsn}
			want, gone := "deleted 1 expired record(s), closed 1 abandoned record(s)\n", store.State("absent")
			if soft {
				args = append(args, "--soft")
				want, gone = "expired 1 expired record(s), closed 1 abandoned record(s)\n", store.StateExpired
			}
			if out, errOut, err := run(args...); err != nil || out != want {
				t.Fatalf("reap: %q %v\n%s", out, err, errOut)
			}
			if got := stateOf(t, old, "old"); got != gone {
				t.Errorf("expired record: %s, want %s", got, gone)
			}
			if got := stateOf(t, old, "fresh"); got != store.StateCompleted {
				t.Errorf("fresh record: %s", got)
			}
			rec, err := old.Get(context.Background(), testScope, "forgotten")
			if err != nil || rec.State != store.StateCompleted || rec.LastError != "abandoned" ||
				rec.Response == nil || rec.Response.Status != http.StatusGatewayTimeout {
				t.Errorf("abandoned record: %+v %v", rec, err)
			}
		})
	}
}

func TestReconcileList(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	ctx := context.Background()
	unknownRecord(t, s, "due")
	later := unknownRecord(t, s, "later")
	dead := unknownRecord(t, s, "dead")
	completedRecord(t, s, "done", time.Hour)
	if err := s.Defer(ctx, store.DeferParams{FenceParams: later, Delay: time.Hour, Error: "resolver: cannot tell\nyet"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Defer(ctx, store.DeferParams{FenceParams: dead, DeadLetter: true, Error: "dead-lettered after 10 attempts"}); err != nil {
		t.Fatal(err)
	}

	out, _, err := run("reconcile", "list", "--store", dsn)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "SCOPE") || !strings.Contains(lines[1], `"due"`) ||
		!strings.Contains(lines[1], `"0:POST /v1/charges"`) || !strings.Contains(lines[1], "upstream hung up") {
		t.Fatalf("list (due only):\n%s", out)
	}

	out, _, err = run("reconcile", "list", "--store", dsn, "--all")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || strings.Contains(out, `"done"`) {
		t.Fatalf("list --all:\n%s", out)
	}
	for _, l := range lines[1:] {
		switch {
		case strings.Contains(l, `"dead"`):
			if !strings.Contains(l, "DEAD-LETTERED") {
				t.Errorf("dead letter not marked: %s", l)
			}
		case strings.Contains(l, `"later"`):
			if strings.Contains(l, "DEAD-LETTERED") || !strings.Contains(l, "resolver: cannot tell yet") {
				t.Errorf("deferred record: %s", l)
			}
		case strings.Contains(l, "DEAD-LETTERED"):
			t.Errorf("marked as dead letter: %s", l)
		}
	}

	out, errOut, err := run("reconcile", "list", "--store", dsn, "--all", "--limit", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		recordView
		DeadLettered bool `json:"dead_lettered"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.State != store.StateUnknown || v.Key != "due" {
		t.Fatalf("list --json --limit 1: %q %v", out, err)
	}
	if !strings.Contains(errOut, "there may be more") {
		t.Errorf("a full page says nothing about more: %q", errOut)
	}
	out, _, _ = run("reconcile", "list", "--store", dsn, "--all", "--json")
	if n := strings.Count(out, `"dead_lettered":true`); n != 1 {
		t.Errorf("%d dead letters in JSON, want 1:\n%s", n, out)
	}
}

// A decision about one execution never settles the next: the record of
// "again" was released, run again and became unknown again; resolving it
// with the first execution's fence changes nothing and says why.
func TestReconcileResolveBoundToFence(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	unknownRecord(t, s, "again")
	first, _ := s.Get(context.Background(), testScope, "again")
	if _, _, err := run("reconcile", "resolve", "again", "--store", dsn, "--scope", testScope, "--fence", fmt.Sprint(first.Fence), "--retryable"); err != nil {
		t.Fatal(err)
	}
	unknownRecord(t, s, "again") // the retry runs, and its outcome is unknown again
	second, _ := s.Get(context.Background(), testScope, "again")
	if second.Fence == first.Fence {
		t.Fatal("the retry kept the fence")
	}
	_, _, err := run("reconcile", "resolve", "again", "--store", dsn, "--scope", testScope, "--fence", fmt.Sprint(first.Fence), "--retryable")
	if err == nil || !strings.Contains(err.Error(), "ran again") || !strings.Contains(err.Error(), fmt.Sprint(second.Fence)) {
		t.Fatalf("resolve with the first execution's fence: %v", err)
	}
	if rec, _ := s.Get(context.Background(), testScope, "again"); rec.State != store.StateUnknown || rec.Fence != second.Fence {
		t.Fatalf("after the refused resolve: %s fence %d", rec.State, rec.Fence)
	}
}

func TestReconcileResolve(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	unknownRecord(t, s, "paid")
	unknownRecord(t, s, "not-paid")
	completedRecord(t, s, "done", time.Hour)
	bodyFile := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(bodyFile, []byte(`{"id":"ch_9"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	fenceOf := func(key string) string {
		rec, err := s.Get(context.Background(), testScope, key)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(rec.Fence)
	}
	// Without --fence: refused, naming the record's fence.
	if _, errOut, err := run("reconcile", "resolve", "paid", "--store", dsn, "--route", "/v1/charges", "--retryable"); !errors.Is(err, ErrUsage) ||
		!strings.Contains(errOut, "--fence is required") || !strings.Contains(errOut, "fence "+fenceOf("paid")) {
		t.Fatalf("resolve without --fence: %v\n%s", err, errOut)
	}
	if got := stateOf(t, s, "paid"); got != store.StateUnknown {
		t.Fatalf("a refused resolve settled the record: %s", got)
	}
	out, errOut, err := run("reconcile", "resolve", "paid", "--store", dsn, "--route", "/v1/charges", "--fence", fenceOf("paid"),
		"--completed", "--status", "201", "--header", "Content-Type: application/json",
		"--header", "X-Charge: ch_9", "--header", "Set-Cookie: s=1", "--body", "@"+bodyFile)
	if err != nil || !strings.Contains(out, "completed") {
		t.Fatalf("resolve --completed: %q %v\n%s", out, err, errOut)
	}
	rec, err := s.Get(context.Background(), testScope, "paid")
	if err != nil || rec.State != store.StateCompleted || rec.Response == nil || rec.Response.Status != 201 ||
		string(rec.Response.Body) != `{"id":"ch_9"}` || rec.Response.Header.Get("X-Charge") != "ch_9" ||
		rec.Response.Header.Get("Content-Type") != "application/json" || rec.Response.Header.Get("Set-Cookie") != "" {
		t.Fatalf("settled record: %+v %+v %v", rec, rec.Response, err)
	}

	if out, _, err := run("reconcile", "resolve", "--store", dsn, "--scope", testScope, "--fence", fenceOf("not-paid"), "--retryable", "not-paid"); err != nil ||
		!strings.Contains(out, "failed_retryable") {
		t.Fatalf("resolve --retryable: %q %v", out, err)
	}
	if got := stateOf(t, s, "not-paid"); got != store.StateFailedRetryable {
		t.Errorf("released record: %s", got)
	}

	// A literal body, and the answers for records that cannot be settled.
	if _, _, err := run("reconcile", "resolve", "done", "--store", dsn, "--scope", testScope, "--fence", fenceOf("done"), "--completed",
		"--status", "200", "--body", "ok"); err == nil || !strings.Contains(err.Error(), "is completed: only unknown records") {
		t.Errorf("resolve a completed record: %v", err)
	}
	if _, _, err := run("reconcile", "resolve", "nope", "--store", dsn, "--scope", testScope, "--fence", "1", "--retryable"); err == nil ||
		!strings.Contains(err.Error(), "no record") {
		t.Errorf("resolve a missing record: %v", err)
	}
	if _, _, err := run("reconcile", "resolve", "paid", "--store", dsn, "--scope", testScope, "--fence", "1", "--completed",
		"--status", "201", "--body", "@"+filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "--body") {
		t.Errorf("resolve with a missing body file: %v", err)
	}

	for _, args := range [][]string{
		{"k", "--scope", testScope}, // no outcome
		{"k", "--scope", testScope, "--completed", "--retryable", "--status", "201"}, // both
		{"k", "--scope", testScope, "--completed"},                                   // no status
		{"k", "--scope", testScope, "--completed", "--status", "99"},
		{"k", "--scope", testScope, "--completed", "--status", "600"},
		{"k", "--scope", testScope, "--retryable", "--status", "201"},
		{"k", "--scope", testScope, "--retryable", "--body", "x"},
		{"k", "--scope", testScope, "--completed", "--status", "201", "--header", "no colon"},
		{"k", "--scope", testScope, "--completed", "--status", "201", "--header", "Bad Name: x"},
		{"k", "--scope", testScope, "--retryable", "--ttl", "0s"},
		{"--scope", testScope, "--retryable"},                       // no key
		{"k", "--retryable"},                                        // no scope
		{"k", "--scope", testScope, "--route", "/x", "--retryable"}, // both
		{"k", "--scope", testScope, "--retryable", "--fence", "0"},
		{"k", "--scope", testScope, "--retryable", "--fence", "-3"},
	} {
		args = append([]string{"reconcile", "resolve", "--store", dsn}, args...)
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want ErrUsage", args, err)
		}
	}
}

// resolverAPI answers the resolve protocol from a table of keys, and keeps
// the questions.
type resolverAPI struct {
	answers map[string]string // key -> answer body; "500" answers 500
	mu      sync.Mutex
	asked   []resolveQuestion
}

func (a *resolverAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var q resolveQuestion
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "want a JSON POST", http.StatusBadRequest)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.asked = append(a.asked, q)
	a.mu.Unlock()
	ans, ok := a.answers[q.Key]
	if !ok || ans == "500" {
		http.Error(w, "boom", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, ans)
}

func (a *resolverAPI) questions() []resolveQuestion {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]resolveQuestion(nil), a.asked...)
}

func TestReconcileRun(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	for _, k := range []string{"paid", "not-paid", "cannot-tell", "broken"} {
		unknownRecord(t, s, k)
	}
	api := &resolverAPI{answers: map[string]string{
		"paid":        `{"outcome":"happened","status":201,"headers":{"Content-Type":"application/json","X-A":["1","2"]},"body":"{\"id\":\"ch_1\"}"}`,
		"not-paid":    `{"outcome":"not_happened"}`,
		"cannot-tell": `{"outcome":"unknown"}`,
		"broken":      "500",
	}}
	srv := newUpstream(t, api)

	out, errOut, err := run("reconcile", "run", "--store", dsn, "--resolve-url", srv.URL+"/idem/resolve")
	if err != nil || out != "resolved 2, deferred 2, dead-lettered 0\n" {
		t.Fatalf("reconcile run: %q %v\n%s", out, err, errOut)
	}
	rec, err := s.Get(context.Background(), testScope, "paid")
	if err != nil || rec.State != store.StateCompleted || string(rec.Response.Body) != `{"id":"ch_1"}` ||
		rec.Response.Status != 201 || strings.Join(rec.Response.Header.Values("X-A"), ",") != "1,2" {
		t.Errorf("paid: %+v %v", rec, err)
	}
	if got := stateOf(t, s, "not-paid"); got != store.StateFailedRetryable {
		t.Errorf("not-paid: %s", got)
	}
	for _, k := range []string{"cannot-tell", "broken"} {
		rec, err := s.Get(context.Background(), testScope, k)
		if err != nil || rec.State != store.StateUnknown || rec.ReconcileAttempts != 1 || !rec.ReconcileAfter.After(time.Now()) {
			t.Errorf("%s: %+v %v", k, rec, err)
		}
	}
	if rec, _ := s.Get(context.Background(), testScope, "broken"); !strings.Contains(rec.LastError, "500") {
		t.Errorf("a failed attempt does not say why: %q", rec.LastError)
	}

	qs := api.questions()
	if len(qs) != 4 {
		t.Fatalf("%d questions, want 4", len(qs))
	}
	for _, q := range qs {
		if q.Scope != testScope || q.Fence <= 0 || q.Fingerprint != "fp-"+q.Key || q.CreatedAt.IsZero() ||
			q.LastError != "upstream hung up" || q.Tenant == nil || *q.Tenant != "" || q.Method != "POST" || q.Route != "/v1/charges" {
			t.Errorf("question %+v", q)
		}
	}

	// Nothing is due any more: the deferred records wait for their backoff.
	if out, _, err := run("reconcile", "run", "--store", dsn, "--resolve-url", srv.URL); err != nil || out != "resolved 0, deferred 0, dead-lettered 0\n" {
		t.Errorf("second run: %q %v", out, err)
	}
	for _, args := range [][]string{
		{"reconcile", "run", "--store", dsn},
		{"reconcile", "run", "--store", dsn, "--resolve-url", "ftp://x"},
		{"reconcile", "run", "--store", dsn, "--resolve-url", srv.URL, "--batch", "0"},
		{"reconcile", "run", "--store", dsn, "--resolve-url", srv.URL, "extra"},
	} {
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want ErrUsage", args, err)
		}
	}
}

func TestMaintenanceCommandErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := "sqlite:" + filepath.Join(dir, "nope.db")
	for _, args := range [][]string{
		{"sweep", "--store", missing},
		{"reap", "--store", missing},
		{"reconcile", "list", "--store", missing},
		{"reconcile", "run", "--store", missing, "--resolve-url", "http://127.0.0.1:1"},
		{"reconcile", "resolve", "--store", missing, "--scope", "s", "--retryable", "k"},
	} {
		if _, _, err := run(args...); err == nil || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("%q on a missing file: %v", args, err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
		t.Errorf("operator commands created %v", m)
	}
	for _, args := range [][]string{
		{"sweep", "extra"},
		{"sweep", "--batch", "0"},
		{"reap", "--batch", "-1"},
		{"reap", "--abandoned-ttl", "0s"},
		{"reap", "--bogus"},
		{"reconcile"},
		{"reconcile", "frobnicate"},
		{"reconcile", "list", "--limit", "0"},
		{"reconcile", "list", "extra"},
	} {
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want ErrUsage", args, err)
		}
	}
	// An empty memory store: every pass has nothing to do.
	for args, want := range map[string]string{
		"sweep":          "swept 0 expired lease(s) to unknown\n",
		"reap":           "deleted 0 expired record(s), closed 0 abandoned record(s)\n",
		"reconcile list": "SCOPE  KEY  FENCE  ATTEMPTS  RECONCILE_AFTER  LAST_ERROR\n",
	} {
		a := append(strings.Fields(args), "--store", "memory:")
		if out, _, err := run(a...); err != nil || out != want {
			t.Errorf("%s on memory: %q %v", args, out, err)
		}
	}
	if _, _, err := run("delete", "--store", "memory:", "--cache", "memcached://x", "--scope", "s", "k"); err == nil ||
		!strings.Contains(err.Error(), "must be a Redis URL") {
		t.Errorf("delete with a cache that is not Redis: %v", err)
	}
	// A store that fails is reported, not swallowed.
	if _, _, err := run("sweep", "--store", "postgres://127.0.0.1:1/none?connect_timeout=1"); err == nil {
		t.Error("sweep on an unreachable store succeeded")
	}
}

func TestMaintenanceHelp(t *testing.T) {
	t.Parallel()
	for args, want := range map[string][]string{
		"help sweep":               {"Usage: idem sweep", "-batch", "lease expired"},
		"help reap":                {"Usage: idem reap", "-soft", "-abandoned-ttl", "504"},
		"help reconcile":           {"Usage: idem reconcile <subcommand>", "list", "resolve", "run"},
		"reconcile list -h":        {"Usage: idem reconcile list", "-all", "-limit", "DEAD", "dead-lettered"},
		"reconcile resolve --help": {"Usage: idem reconcile resolve", "-completed", "-retryable", "-status", "-header", "-body", "@FILE", "len(tenant)"},
		"reconcile run -h":         {"Usage: idem reconcile run", "-resolve-url", `"outcome":"happened"`, "not_happened", "body_base64"},
		"help proxy":               {"-maintenance", "-sweep-interval", "-reap-interval", "-soft-expire", "-resolve-url", "-cache", "/metrics", `"outcome":"unknown"`},
		"help delete":              {"-cache", "replay cache"},
	} {
		var out, errOut strings.Builder
		err := Run(context.Background(), strings.Fields(args), &out, &errOut)
		text := out.String() + errOut.String()
		if err != nil {
			t.Errorf("%s: %v", args, err)
		}
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s does not mention %q:\n%s", args, w, text)
			}
		}
	}
	out, _, _ := run("help")
	for _, c := range []string{"sweep", "reap", "reconcile"} {
		if !strings.Contains(out, "  "+c+" ") {
			t.Errorf("usage does not list %s:\n%s", c, out)
		}
	}
}
