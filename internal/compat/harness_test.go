package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// binDir holds the idem binary built for this run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-compat-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	stopMock()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildErr  error
)

// idemBinary builds cmd/idem once per run, as a user would install it.
func idemBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(binDir, "idem")
	buildOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", bin, ".")
		cmd.Dir = filepath.Join("..", "..", "cmd", "idem")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build cmd/idem: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// full reports the full run (make compat, IDEM_COMPAT_CALLS set): it adds
// the variants with --wait 0 to the proxy's defaults, and more calls.
func full() bool { return os.Getenv("IDEM_COMPAT_CALLS") != "" }

// calls is the number of logical calls of one variant: a few hundred in
// all by default, IDEM_COMPAT_CALLS for the full run (make compat).
func calls(t *testing.T, reduced int) int {
	t.Helper()
	v := os.Getenv("IDEM_COMPAT_CALLS")
	if v == "" {
		return reduced
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("IDEM_COMPAT_CALLS=%q: want a positive number", v)
	}
	return n
}

// callers is the number of concurrent callers of every variant.
const callers = 16

// waitListening waits until addr accepts connections or the process ends.
func waitListening(t *testing.T, addr string, exited <-chan struct{}, log *testenv.Buffer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("the process meant to listen on %s exited:\n%s", addr, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("nothing listens on %s after 30s:\n%s", addr, log)
}

// start runs a process until the test ends, and waits until it listens on
// addr.
func start(t *testing.T, addr string, env []string, name string, args ...string) *exec.Cmd {
	t.Helper()
	log := &testenv.Buffer{}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(name), log)
		}
	})
	waitListening(t, addr, exited, log)
	return cmd
}

var (
	mockOnce sync.Once
	mockURL  string
)

// stripeMock returns the URL of a stripe-mock, started for the run. It is
// looked up on PATH and in $GOPATH/bin; without it the test is skipped
// (failed under CI=true; .ci/run installs it).
func stripeMock(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("stripe-mock")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		bin = filepath.Join(string(bytes.TrimSpace(gopath)), "bin", "stripe-mock")
		if _, err := os.Stat(bin); err != nil {
			testenv.Skip(t, "stripe-mock is not installed (go install github.com/stripe/stripe-mock@v0.203.0)")
		}
	}
	mockOnce.Do(func() {
		addr := testenv.FreeAddr(t)
		cmd := exec.Command(bin, "-http-addr", addr)
		log := &testenv.Buffer{}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatalf("start stripe-mock: %v", err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		waitListening(t, addr, exited, log)
		mockURL = "http://" + addr
		stopMock = func() { cmd.Process.Kill(); <-exited } // it serves the whole run
	})
	if mockURL == "" {
		t.Fatal("stripe-mock did not start in an earlier test")
	}
	return mockURL
}

// stopMock ends the shared stripe-mock; TestMain's cleanup calls it.
var stopMock = func() {}

// execution is one request the upstream ran.
type execution struct {
	n    int
	call string // the logical call's id, from the request body
	id   string // the id of the object it created
	key  string // the Idempotency-Key it carried
}

// ledger stands in front of the upstream API and records every execution:
// each POST gets an object id and a Request-Id of its own, so a client's
// answer names the execution that produced it. delay slows every POST.
type ledger struct {
	upstream string
	delay    time.Duration
	client   *http.Client

	mu    sync.Mutex
	execs []execution
}

var callField = regexp.MustCompile(`call-[0-9]+`)

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, _ := http.NewRequestWithContext(r.Context(), r.Method, l.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	for k, v := range r.Header {
		out.Header[k] = v
	}
	resp, err := l.client.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if r.Method == http.MethodPost && resp.StatusCode < 300 {
		l.mu.Lock()
		n := len(l.execs) + 1
		x := execution{n: n, call: callField.FindString(string(body)), id: fmt.Sprintf("cus_exec%06d", n),
			key: r.Header.Get("Idempotency-Key")}
		l.execs = append(l.execs, x)
		l.mu.Unlock()
		var doc map[string]any
		if err := json.Unmarshal(answer, &doc); err != nil {
			http.Error(w, "upstream answer is not JSON: "+err.Error(), http.StatusBadGateway)
			return
		}
		doc["id"] = x.id
		answer, _ = json.Marshal(doc)
		w.Header().Set("Request-Id", x.requestID())
		time.Sleep(l.delay)
	}
	for k, v := range resp.Header {
		if k != "Content-Length" && k != "Request-Id" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(answer)
}

// requestID is the Request-Id the ledger gave x's answer.
func (x execution) requestID() string { return fmt.Sprintf("req_exec%06d", x.n) }

func (l *ledger) executions() []execution {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]execution(nil), l.execs...)
}

// relay forwards requests to the proxy and, for every tenth POST, loses
// the answer: it forwards the request, then closes the client's connection
// without a byte of answer, either at once (the retry meets the first
// execution still running) or once the answer came back (the retry meets
// a completed record).
type relay struct {
	target *url.URL
	tr     *http.Transport
	posts  atomic.Int64
	drops  atomic.Int64
	// refusals counts the in-flight refusals (409, 429) passed back.
	refusals atomic.Int64
	wg       sync.WaitGroup
}

func (rl *relay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	out, _ := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method,
		rl.target.String()+r.URL.RequestURI(), bytes.NewReader(body))
	out.Header = r.Header.Clone()
	n := int64(-1)
	if r.Method == http.MethodPost {
		n = rl.posts.Add(1)
	}
	if n%10 == 3 {
		rl.drops.Add(1)
		done := make(chan struct{})
		rl.wg.Add(1)
		go func() {
			defer rl.wg.Done()
			defer close(done)
			if resp, err := rl.tr.RoundTrip(out); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		if n%20 == 13 {
			<-done // the answer came back; lose it
		} else {
			time.Sleep(time.Millisecond) // let the request reach the proxy first
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	resp, err := rl.tr.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusTooManyRequests {
		rl.refusals.Add(1)
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// serve runs h on a loopback port until the test ends.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// stack is one variant's chain: client -> relay -> idem proxy -> ledger ->
// upstream.
type stack struct {
	proxy    *exec.Cmd
	proxyURL string
	relayURL string
	relay    *relay
	ledger   *ledger
}

// stores are the stores every variant runs on: a SQLite file, and a
// private schema of the PostgreSQL server (skipped without
// IDEM_TEST_POSTGRES_URL, failed under CI=true).
func stores(t *testing.T, f func(t *testing.T, dsn string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, pgdb.URL(t, testenv.PostgresURL(t)))
	})
}

// newStack starts a ledger in front of upstream, an idem proxy on dsn in
// front of the ledger with the flags in args, and the relay in front of
// the proxy.
func newStack(t *testing.T, upstream, dsn string, delay time.Duration, args ...string) *stack {
	t.Helper()
	if v := os.Getenv("IDEM_COMPAT_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("IDEM_COMPAT_DELAY=%q: %v", v, err)
		}
		delay = d
	}
	args = append(args, strings.Fields(os.Getenv("IDEM_COMPAT_PROXY_FLAGS"))...)
	l := &ledger{upstream: upstream, delay: delay, client: &http.Client{Timeout: time.Minute}}
	ledgerURL := serve(t, l)
	addr := testenv.FreeAddr(t)
	cmd := start(t, addr, []string{"IDEM_TENANT_SECRET=compat-test-secret"}, idemBinary(t),
		append([]string{"proxy", "--listen", addr, "--upstream", ledgerURL, "--store", dsn,
			"--tenant-from", "authorization", "--log-level", "warn"}, args...)...)
	target, _ := url.Parse("http://" + addr)
	rl := &relay{target: target, tr: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(func() { rl.wg.Wait(); rl.tr.CloseIdleConnections() })
	return &stack{proxy: cmd, proxyURL: "http://" + addr, relayURL: serve(t, rl), relay: rl, ledger: l}
}

// outcome is what one logical call ended with, seen by its client.
type outcome struct {
	call string
	id   string // the object's id in the answer; "" when the call failed
	err  string // why the call failed
	// requestID is the answer's Request-Id, when the client reports it;
	// replayed and original its Idempotent-Replayed and Original-Request.
	requestID, original string
	replayed            bool
	// key is the Idempotency-Key the answer echoed, when the client
	// reports it.
	key string
}

// verify checks the variant's outcomes against the ledger: every call ran
// exactly once upstream, got the object its own execution created, and
// none failed. It returns the counts for the report.
func (s *stack) verify(t *testing.T, outcomes []outcome) {
	t.Helper()
	byCall := map[string][]execution{}
	for _, x := range s.ledger.executions() {
		byCall[x.call] = append(byCall[x.call], x)
	}
	var failed, duplicates, wrong, missing int
	for _, o := range outcomes {
		xs := byCall[o.call]
		switch {
		case len(xs) == 0:
			missing++
		case len(xs) > 1:
			duplicates += len(xs) - 1
		}
		switch {
		case o.err != "":
			failed++
			if failed <= 5 {
				t.Errorf("%s failed: %s", o.call, o.err)
			}
		case len(xs) > 0 && o.id != xs[0].id:
			wrong++
			if wrong <= 5 {
				t.Errorf("%s got %q, but its execution created %q", o.call, o.id, xs[0].id)
			}
		case len(xs) > 0 && o.requestID != "" && o.requestID != xs[0].requestID():
			wrong++
			t.Errorf("%s got Request-Id %q, but its execution's was %q", o.call, o.requestID, xs[0].requestID())
		case len(xs) > 0 && o.key != "" && o.key != xs[0].key:
			wrong++
			t.Errorf("%s got the key %q echoed, but its execution ran under %q", o.call, o.key, xs[0].key)
		}
	}
	t.Logf("%d calls, %d executions, %d answers lost by the relay, %d in-flight refusals (409, 429) retried: %d failed, %d duplicates, %d wrong answers, %d never ran",
		len(outcomes), len(s.ledger.executions()), s.relay.drops.Load(), s.relay.refusals.Load(), failed, duplicates, wrong, missing)
	if duplicates+missing > 0 {
		t.Errorf("%d calls ran more than once (%d extra executions), %d never ran", len(outcomes)-len(byCall)+duplicates, duplicates, missing)
	}
	if s.relay.drops.Load() == 0 {
		t.Error("the relay lost no answer: the run proves nothing about retries")
	}
}

// run makes n logical calls on callers goroutines; do makes call i and
// returns the id its client got.
func run(n int, do func(i int) outcome) []outcome {
	out := make([]outcome, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				out[i] = do(i)
			}
		})
	}
	wg.Wait()
	return out
}
