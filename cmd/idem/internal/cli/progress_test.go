package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// lineWriter is a stderr that tells when a line with a given prefix has
// been written, so that a test can hold a command until it has printed
// progress while running.
type lineWriter struct {
	prefix string
	mu     sync.Mutex
	buf    bytes.Buffer
	seen   chan struct{}
	once   sync.Once
}

func newLineWriter(prefix string) *lineWriter {
	return &lineWriter{prefix: prefix, seen: make(chan struct{})}
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for _, line := range strings.SplitAfter(w.buf.String(), "\n") {
		if strings.HasSuffix(line, "\n") && strings.HasPrefix(line, w.prefix) {
			w.once.Do(func() { close(w.seen) })
		}
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// lines returns the lines written that start with the prefix.
func (w *lineWriter) lines() []string {
	var out []string
	for _, l := range strings.Split(w.String(), "\n") {
		if strings.HasPrefix(l, w.prefix) {
			out = append(out, l)
		}
	}
	return out
}

// heldUntil wraps h so that its first request waits until w has printed a
// progress line: the command is then certainly reporting while it runs.
func heldUntil(t *testing.T, w *lineWriter, h http.Handler) http.Handler {
	var first sync.Once
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		first.Do(func() {
			select {
			case <-w.seen:
			case <-time.After(30 * time.Second):
				t.Error("no progress line while the command ran")
			}
		})
		h.ServeHTTP(rw, r)
	})
}

// checkLines checks that every progress line matches re, that there are
// at least two (one while running, the final one) and that the last is
// final.
func checkLines(t *testing.T, lines []string, re, final string) {
	t.Helper()
	if len(lines) < 2 {
		t.Errorf("%d progress lines, want one while running and the final one: %q", len(lines), lines)
	}
	for _, l := range lines {
		if !regexp.MustCompile(re).MatchString(l) {
			t.Errorf("progress line %q does not match %s", l, re)
		}
	}
	if len(lines) > 0 && !strings.HasPrefix(lines[len(lines)-1], final) {
		t.Errorf("last progress line %q, want %q...", lines[len(lines)-1], final)
	}
}

func TestBenchProgress(t *testing.T) {
	t.Parallel()
	w := newLineWriter("bench: ")
	up := newUpstream(t, heldUntil(t, w, &chargeAPI{}))
	var out bytes.Buffer
	err := Run(context.Background(), []string{"bench", "--url", up.URL, "--keys", "6", "--dups", "1", "--concurrency", "2",
		"--progress", "--progress-interval", "5ms"}, &out, w)
	if err != nil {
		t.Fatalf("bench: %v\n%s%s", err, out.String(), w.String())
	}
	checkLines(t, w.lines(), `^bench: \d/6 requests, \d+\.\d/s, 0 errors$`, "bench: 6/6 requests, ")
	if strings.Contains(out.String(), "bench: ") && strings.Contains(out.String(), "/6 requests") {
		t.Errorf("progress on stdout:\n%s", out.String())
	}

	// Errors are counted as they happen; without --progress, and stderr
	// not a terminal, there is no progress line.
	e := newLineWriter("bench: ")
	err = Run(context.Background(), []string{"bench", "--url", "http://127.0.0.1:1/", "--keys", "3", "--dups", "1",
		"--progress", "--progress-interval", "1h"}, io.Discard, e)
	if err == nil || len(e.lines()) != 1 || !strings.HasPrefix(e.lines()[0], "bench: 3/3 requests, ") ||
		!strings.HasSuffix(e.lines()[0], ", 3 errors") {
		t.Errorf("bench of a closed port: %v %q", err, e.lines())
	}
	q := newLineWriter("bench: ")
	if err := Run(context.Background(), []string{"bench", "--url", up.URL, "--keys", "2", "--dups", "1"}, io.Discard, q); err != nil ||
		len(q.lines()) != 0 {
		t.Errorf("bench without --progress: %v %q", err, q.lines())
	}
}

func TestReconcileRunProgress(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	api := &resolverAPI{answers: map[string]string{}}
	for i := range 5 {
		k := fmt.Sprintf("u%d", i)
		unknownRecord(t, s, k)
		api.answers[k] = `{"outcome":"not_happened"}`
	}
	w := newLineWriter("reconcile: ")
	srv := newUpstream(t, heldUntil(t, w, api))
	var out bytes.Buffer
	err := Run(context.Background(), []string{"reconcile", "run", "--store", dsn, "--resolve-url", srv.URL, "--batch", "2",
		"--progress", "--progress-interval", "5ms"}, &out, w)
	if err != nil || out.String() != "resolved 5, deferred 0, dead-lettered 0\n" {
		t.Fatalf("reconcile run: %v %q\n%s", err, out.String(), w.String())
	}
	checkLines(t, w.lines(), `^reconcile: ([02-3] batches|1 batch), ([02-5] records|1 record) asked about, \d+\.\d/s, \S+$`,
		"reconcile: 3 batches, 5 records asked about, ")
}

func TestReapProgress(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	old := seeded(t, dsn, time.Now().Add(-48*time.Hour))
	for i := range 4 {
		completedRecord(t, old, fmt.Sprintf("old-%d", i), time.Hour)
	}
	unknownRecord(t, old, "forgotten")
	w := newLineWriter("reap: ")
	var out bytes.Buffer
	// The final line is printed whatever the interval: it has the counts.
	err := Run(context.Background(), []string{"reap", "--store", dsn, "--batch", "2", "--progress", "--progress-interval", "1h"}, &out, w)
	if err != nil || out.String() != "deleted 4 expired record(s), closed 1 abandoned record(s)\n" {
		t.Fatalf("reap: %v %q\n%s", err, out.String(), w.String())
	}
	lines := w.lines()
	if len(lines) != 1 || !regexp.MustCompile(`^reap: 3 batches, 5 records \(deleted 4, abandoned 1\), \d+\.\d/s, \S+$`).MatchString(lines[0]) {
		t.Errorf("progress lines %q", lines)
	}

	for _, args := range [][]string{
		{"reap", "--store", dsn, "--progress-interval", "0"},
		{"bench", "--url", "http://x", "--progress-interval", "-1s"},
		{"reconcile", "run", "--store", dsn, "--resolve-url", "http://x", "--progress-interval", "0s"},
	} {
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want ErrUsage", args, err)
		}
	}
	// Off when stderr is no terminal and --progress is not given.
	q := newLineWriter("reap: ")
	if err := Run(context.Background(), []string{"reap", "--store", dsn}, io.Discard, q); err != nil || len(q.lines()) != 0 {
		t.Errorf("reap without --progress: %v %q", err, q.lines())
	}
}

// On a terminal the line is rewritten in place, and the last one ends it.
func TestProgressOnATerminal(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	p := &progress{w: &b, every: time.Hour, term: true}
	p.print("bench: 1/4", false)
	p.print("bench: 2/4", false)
	p.print("bench: 4/4", true)
	if got, want := b.String(), "\r\033[Kbench: 1/4\r\033[Kbench: 2/4\r\033[Kbench: 4/4\n"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	var nilp *progress
	nilp.start(func() string { t.Error("a nil progress printed"); return "" })()
	if isTerminal(&b) {
		t.Error("a buffer is a terminal")
	}
}
