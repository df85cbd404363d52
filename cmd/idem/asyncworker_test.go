package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	_ "github.com/jackc/pgx/v5/stdlib"
)

const (
	reportKey  = "report-2030-11"
	reportBody = `{"month":"2030-11"}`
	reportPath = "/v1/reports"
)

// An asynchronous worker really dies: two proxy processes share a store,
// each with its own upstream address (to tell which proxy's worker runs a
// request) in front of one upstream that holds the first execution. The
// proxy whose worker claimed the request is SIGKILLed while the upstream
// runs it; the lease policy then decides. Under unknown (the default) the
// surviving proxy's sweeper marks the record unknown once the lease and
// the sweep grace passed, the status resource and a retry answer 409
// outcome-unknown, and the upstream ran once. Under retry, a retry after
// the lease ran out queues the request again, the surviving proxy's
// worker runs it, and the upstream ran exactly twice.
func TestAsyncWorkerKilled(t *testing.T) {
	skipShort(t)
	stores := map[string]func(t *testing.T) string{
		"sqlite": func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "idem.db") },
		"postgres": func(t *testing.T) string {
			u, err := url.Parse(testenv.PostgresURL(t))
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("search_path", pgdb.Schema(t, u.String()))
			u.RawQuery = q.Encode()
			return u.String()
		},
	}
	for name, dsn := range stores {
		for _, policy := range []string{"unknown", "retry"} {
			t.Run(name+"/"+policy, func(t *testing.T) {
				t.Parallel()
				asyncWorkerKilled(t, dsn(t), policy)
			})
		}
	}
}

func asyncWorkerKilled(t *testing.T, dsn, policy string) {
	api, up1 := newBlockingAPI(t)
	api.holdFirst = true
	up2 := httptest.NewServer(api)
	t.Cleanup(func() {
		up2.CloseClientConnections() // frees a handler still holding a request
		up2.Close()
	})
	args := []string{"--store", dsn, "--single-tenant", "--async", "POST " + reportPath,
		"--lease", "2s", "--lease-policy", policy, "--sweep-interval", "100ms", "--async-poll", "50ms"}
	a := startProxy(t, append(args, "--upstream", up1.URL)...)
	b := startProxy(t, append(args, "--upstream", up2.URL)...)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	r, err := post(c, a.base+reportPath, reportKey, reportBody)
	if err != nil {
		t.Fatal(err)
	}
	loc := r.header.Get("Location")
	if r.status != http.StatusAccepted || !strings.HasPrefix(loc, idem.DefaultStatusPath) {
		t.Fatalf("first request: %d Location %q %s, want 202", r.status, loc, r.body)
	}
	select {
	case <-api.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no worker forwarded the request")
	}
	victim, survivor, survivorHost := a, b, hostOf(up2.URL)
	if api.host(0) == survivorHost {
		victim, survivor, survivorHost = b, a, hostOf(up1.URL)
	}
	victim.kill(t)
	killed := time.Now()
	defer func() { t.Logf("settled %v after the kill", time.Since(killed)) }()

	switch policy {
	case "unknown":
		// Reads of the status resource change nothing: the record turns
		// unknown by the survivor's sweeper alone.
		r = pollWhileAccepted(t, func() (reply, error) { return get(c, survivor.base+loc) })
		for _, r := range []reply{r, mustPost(t, c, survivor.base+reportPath)} {
			if r.status != http.StatusConflict || problemType(r.body) != idem.ProblemBase+idem.SlugOutcomeUnknown {
				t.Fatalf("after the worker died: %d %s, want 409 outcome-unknown", r.status, r.body)
			}
		}
		out, errOut, err := runIdem(t, "reconcile", "list", "--store", dsn)
		if err != nil || !strings.Contains(out, `"`+reportKey+`"`) || !strings.Contains(out, "lease_expired") {
			t.Fatalf("reconcile list: %v\n%s%s", err, out, errOut)
		}
		if n := api.calls.Load(); n != 1 {
			t.Fatalf("upstream called %d times, want 1", n)
		}
	case "retry":
		// Retries answer 202 while the dead worker's lease runs; the
		// first one after it queues the request again.
		r = pollWhileAccepted(t, func() (reply, error) { return post(c, survivor.base+reportPath, reportKey, reportBody) })
		for _, r := range []reply{r, mustPost(t, c, survivor.base+reportPath)} {
			if r.status != http.StatusCreated || r.body != `{"id":"from-upstream"}` || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("after the worker died: %d %v %s, want the second run's 201, replayed", r.status, r.header, r.body)
			}
		}
		if n := api.calls.Load(); n != 2 {
			t.Fatalf("upstream called %d times, want 2", n)
		}
		if h := api.host(1); h != survivorHost {
			t.Fatalf("the second run came through %s, want the surviving proxy's upstream %s", h, survivorHost)
		}
	}
	survivor.stop(t)
}

// pollWhileAccepted sends until the answer is not 202, with a generous
// deadline, and returns that answer.
func pollWhileAccepted(t *testing.T, send func() (reply, error)) reply {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := send()
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusAccepted {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("still 202 after a minute: %s", r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mustPost(t *testing.T, c *http.Client, url string) reply {
	t.Helper()
	r, err := post(c, url, reportKey, reportBody)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func get(c *http.Client, url string) (reply, error) {
	resp, err := c.Get(url)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

func hostOf(u string) string { return strings.TrimPrefix(u, "http://") }
