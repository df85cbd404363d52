package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// benchRow returns the count column of a class row of the bench report.
func benchRow(t *testing.T, out, class string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(class) + `\s+(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q row in:\n%s", class, out)
	}
	return m[1]
}

func TestBenchThroughTheProxy(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, delayed(&chargeAPI{}, 5*time.Millisecond))
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:"})

	t.Run("duplicates", func(t *testing.T) {
		t.Parallel()
		out, _, err := run("bench", "--keys", "20", "--dups", "3", "--concurrency", "8", base+"/v1/charges")
		t.Log("\n" + out)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "60 requests in ") || !strings.Contains(out, "no key ran twice: 20 executions for 20 keys") {
			t.Errorf("report")
		}
		if n := benchRow(t, out, "first executions"); n != "20" {
			t.Errorf("%s first executions, want 20", n)
		}
		for _, want := range []string{"requests/s", "p50", "p99", "max", "409 in progress", "statuses:  201 x "} {
			if !strings.Contains(out, want) {
				t.Errorf("report lacks %q", want)
			}
		}
	})
	t.Run("replay only", func(t *testing.T) {
		t.Parallel()
		out, _, err := run("bench", "--url", base+"/v1/charges", "--keys", "10", "--dups", "5", "--concurrency", "4", "--replay-only")
		t.Log("\n" + out)
		if err != nil {
			t.Fatal(err)
		}
		if n := benchRow(t, out, "replays"); n != "50" {
			t.Errorf("%s replays, want 50", n)
		}
		if !strings.Contains(out, "no request ran again: 0 new executions") {
			t.Errorf("report")
		}
	})
	t.Run("duration", func(t *testing.T) {
		t.Parallel()
		out, _, err := run("bench", "--url", base+"/v1/charges", "--keys", "5", "--dups", "2", "--concurrency", "4",
			"--duration", "200ms", "--header", "Authorization: Bearer bench")
		t.Log("\n" + out)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "new keys every round for 200ms") || !strings.Contains(out, "no key ran twice") {
			t.Errorf("report")
		}
	})
}

func TestBenchReportsDuplicateExecutions(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{}) // no idempotency at all
	out, _, err := run("bench", "--keys", "5", "--dups", "3", "--concurrency", "3", up.URL)
	t.Log("\n" + out)
	if err == nil || !strings.Contains(err.Error(), "ran more than once") {
		t.Fatalf("bench of a plain API: %v", err)
	}
	if !strings.Contains(out, "DUPLICATES: 5 keys were answered as new executions more than once (15 executions for 5 keys)") {
		t.Errorf("report")
	}
	if _, _, err := run("bench", "--url", "http://127.0.0.1:1/", "--keys", "2", "--dups", "1", "--timeout", "2s"); err == nil ||
		!strings.Contains(err.Error(), "2 requests failed") {
		t.Errorf("bench of a closed port: %v", err)
	}
}

func TestBenchUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench"},
		{"bench", "ftp://x"},
		{"bench", "--url", "ftp://x"},
		{"bench", "--keys", "0", "http://x"},
		{"bench", "--duration", "-1s", "http://x"},
		{"bench", "http://x", "extra"},
		{"bench", "--url", "http://x", "http://y"},
	} {
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want ErrUsage", args, err)
		}
	}
}

// idem check and idem bench take the URL the same way, as an argument;
// bench still accepts the older --url.
func TestCheckAndBenchTakeTheURLAlike(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"check", "bench"} {
		var help strings.Builder
		if err := Run(context.Background(), []string{"help", name}, &help, io.Discard); err != nil {
			t.Fatal(err)
		}
		if want := "Usage: idem " + name + " URL [flags]"; !strings.HasPrefix(help.String(), want) {
			t.Errorf("idem help %s starts %q, want %q", name, strings.SplitN(help.String(), "\n", 2)[0], want)
		}
	}
	up := newUpstream(t, &chargeAPI{})
	_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:"})
	for _, args := range [][]string{
		{"bench", "--keys", "2", "--dups", "2", base + "/v1/charges"},
		{"bench", "--keys", "2", "--dups", "2", "--url", base + "/v1/charges"},
	} {
		if out, _, err := run(args...); err != nil || benchRow(t, out, "first executions") != "2" {
			t.Errorf("%q: %v\n%s", args, err, out)
		}
	}
	if _, _, err := run("bench", "--keys", "2"); err == nil || !strings.Contains(err.Error(), "idem bench URL") {
		t.Errorf("bench without a URL: %v", err)
	}
}

// The report's counts agree with their nouns: one key, one duplicate.
func TestBenchReportSingular(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, &chargeAPI{})
	out, _, err := run("bench", "--keys", "1", "--dups", "1", "--concurrency", "1", up.URL)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"1 key x 1 duplicate, shuffled", "1 request in ", "0 errors", "no key ran twice: 1 execution for 1 key"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// A duplicate deferred while its key runs is not an execution, whatever
// status the profile gives the deferral: Stripe's 429 lock_timeout, or a
// 202 request-in-progress.
func TestBenchCountsEveryInFlightAnswerAsADeferral(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idem.Config{
		"stripe 429": {Profile: idem.ProfileStripe},
		"ietf 202":   {InProgressStatus: http.StatusAccepted},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, delayed(&chargeAPI{}, 100*time.Millisecond))
			_, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", Config: cfg})
			out, _, err := run("bench", "--keys", "4", "--dups", "4", "--concurrency", "16", base+"/v1/charges")
			t.Log("\n" + out)
			if err != nil {
				t.Errorf("bench: %v", err)
			}
			if n := benchRow(t, out, "first executions"); n != "4" {
				t.Errorf("%s first executions, want 4", n)
			}
			if n := benchRow(t, out, "409 in progress"); n == "0" {
				t.Errorf("no deferral counted; the duplicates did not meet in flight")
			}
		})
	}
}

// A 5xx is a failed request, not a first execution: a target whose
// upstream is down fails the run.
func TestBenchCounts5xxAsFailures(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream down", http.StatusBadGateway)
	}))
	out, _, err := run("bench", "--keys", "3", "--dups", "2", "--concurrency", "2", up.URL)
	t.Log("\n" + out)
	if err == nil || !strings.Contains(err.Error(), "6 requests answered 5xx") {
		t.Errorf("bench of an API answering 502: %v, want a failure naming the 5xx answers", err)
	}
	if n := benchRow(t, out, "first executions"); n != "0" {
		t.Errorf("%s first executions, want 0", n)
	}
	if n := benchRow(t, out, "5xx answers"); n != "6" {
		t.Errorf("%s 5xx answers, want 6", n)
	}
}

// Ctrl-C stops a run at once, also while a replay-only run waits for its
// first answer, and an interrupted run does not exit as a complete one.
func TestBenchInterrupted(t *testing.T) {
	t.Parallel()
	interrupt := func(t *testing.T, up http.Handler, args ...string) (string, time.Duration, error) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		time.AfterFunc(300*time.Millisecond, cancel)
		var out strings.Builder
		start := time.Now()
		err := Run(ctx, append(append([]string{"bench"}, args...), newUpstream(t, up).URL), &out, io.Discard)
		return out.String(), time.Since(start), err
	}
	t.Run("replay only, first answer in flight", func(t *testing.T) {
		t.Parallel()
		inFlight := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
		})
		_, took, err := interrupt(t, inFlight, "--replay-only", "--timeout", "20s")
		if took > 5*time.Second || !errors.Is(err, context.Canceled) {
			t.Errorf("interrupted after 300ms: returned after %s with %v", took.Round(time.Millisecond), err)
		}
	})
	t.Run("during the run", func(t *testing.T) {
		t.Parallel()
		out, took, err := interrupt(t, delayed(&chargeAPI{}, 50*time.Millisecond),
			"--keys", "1000", "--dups", "1", "--concurrency", "2")
		t.Log("\n" + out)
		if took > 5*time.Second || !errors.Is(err, context.Canceled) {
			t.Errorf("interrupted after 300ms: returned after %s with %v", took.Round(time.Millisecond), err)
		}
		if !strings.Contains(out, "requests in ") {
			t.Errorf("an interrupted run does not report what it did")
		}
	})
}
