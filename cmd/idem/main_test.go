package main

// These tests run the real idem binary as a separate process, so that a
// crash is a real SIGKILL: no deferred function, no graceful shutdown, the
// store left as the kernel found it.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem"
)

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// idemBinary builds the idem binary once per test run, with -race when the
// tests run under it.
func idemBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "idem-bin-"); binErr != nil {
			return
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = "go"
		}
		binPath = filepath.Join(binDir, "idem")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command(goTool, append(args, ".")...).CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// runIdem runs one idem command to its end.
func runIdem(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	bin := idemBinary(t) // the build does not count against the command's time
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// proxyProc is an idem proxy process.
type proxyProc struct {
	cmd  *exec.Cmd
	log  string // its stderr, a file
	base string // http://host:port
	done chan error
}

// startProxy starts `idem proxy args...` on a free port and waits until it
// listens; the test's cleanup kills it.
func startProxy(t *testing.T, args ...string) *proxyProc {
	t.Helper()
	p, err := spawnProxy(idemBinary(t), t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("proxy log %s:\n%s", p.log, b)
		}
	})
	return p
}

// spawnProxy starts `bin proxy args...` on a free port, logging to a new
// file in logDir, and waits until it listens. The caller ends the process.
func spawnProxy(bin, logDir string, args ...string) (*proxyProc, error) {
	logFile, err := os.CreateTemp(logDir, "proxy-*.log")
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	args = append([]string{"proxy", "--listen", "127.0.0.1:0", "--log-format", "json"}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proxyProc{cmd: cmd, log: logFile.Name(), done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()

	deadline := time.Now().Add(30 * time.Second)
	for p.base == "" {
		select {
		case err := <-p.done:
			p.done <- err
			b, _ := os.ReadFile(p.log)
			return nil, fmt.Errorf("idem proxy exited: %v\n%s", err, b)
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-p.done
			return nil, errors.New("idem proxy did not start listening")
		}
		time.Sleep(10 * time.Millisecond)
		p.base = listenAddr(p.log)
	}
	return p, nil
}

// listenAddr reads the proxy's start line from its log.
func listenAddr(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct{ Msg, Listen string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "idem proxy listening" && line.Listen != "" {
			return "http://" + line.Listen
		}
	}
	return ""
}

// kill crashes the proxy: SIGKILL, nothing runs after it.
func (p *proxyProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-p.done; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("proxy after SIGKILL: %v", err)
	}
	p.done <- nil
}

// stop shuts the proxy down as an orchestrator does, and expects a clean exit.
func (p *proxyProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("proxy after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("proxy did not stop after SIGTERM")
	}
}

// blockingAPI is an upstream whose charge endpoint holds every request
// (only the first one with holdFirst) until the client side goes away or
// the test ends.
type blockingAPI struct {
	calls   atomic.Int64
	entered chan struct{}
	release chan struct{}

	holdFirst bool
	mu        sync.Mutex
	hosts     []string // the Host of every call, in order
}

func newBlockingAPI(t *testing.T) (*blockingAPI, *httptest.Server) {
	a := &blockingAPI{entered: make(chan struct{}, 16), release: make(chan struct{})}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(a.release) }) // runs first: frees the handlers Close waits for
	return a, srv
}

func (a *blockingAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	n := a.calls.Add(1)
	a.mu.Lock()
	a.hosts = append(a.hosts, r.Host)
	a.mu.Unlock()
	a.entered <- struct{}{}
	if !a.holdFirst || n == 1 {
		select {
		case <-r.Context().Done():
		case <-a.release:
		}
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"from-upstream"}`)
}

// host returns the Host of the n-th call (from 0).
func (a *blockingAPI) host(n int) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n >= len(a.hosts) {
		return ""
	}
	return a.hosts[n]
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(c *http.Client, url, key, body string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

func problemType(body string) string {
	var p struct{ Type string }
	json.Unmarshal([]byte(body), &p)
	return p.Type
}

const (
	chargeKey  = "order-42"
	chargeBody = `{"amount":4200,"currency":"eur"}`
	chargePath = "/v1/charges"
)

// crashMidRequest runs the scenario both acceptance tests share: a proxy
// is SIGKILLed while the upstream handles a request; a new proxy on the
// same store answers the retry, once the lease expired, with 409 outcome
// unknown, without calling the upstream again. It returns the new proxy,
// the store DSN, the upstream and a client.
func crashMidRequest(t *testing.T) (*proxyProc, string, *blockingAPI, *http.Client) {
	api, up := newBlockingAPI(t)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	args := []string{"--store", dsn, "--lease", "1s", "--upstream", up.URL, "--sweep-interval", "100ms", "--single-tenant"}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	first := startProxy(t, args...)
	sent := make(chan error, 1)
	go func() {
		r, err := post(c, first.base+chargePath, chargeKey, chargeBody)
		if err == nil {
			err = fmt.Errorf("answered %d %s", r.status, r.body)
		}
		sent <- err
	}()
	select {
	case <-api.entered:
	case err := <-sent:
		t.Fatalf("the request never reached the upstream: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	first.kill(t)
	if err := <-sent; err == nil || strings.Contains(err.Error(), "answered") {
		t.Fatalf("the client of the killed proxy got: %v", err)
	}

	second := startProxy(t, args...)
	var r reply
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if r, err = post(c, second.base+chargePath, chargeKey, chargeBody); err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusConflict || problemType(r.body) != idem.ProblemBase+"request-in-progress" {
			break // the lease (1s) has expired: no longer in progress
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead proxy's lease never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.status != http.StatusConflict || problemType(r.body) != idem.ProblemBase+"outcome-unknown" {
		t.Fatalf("retry after the crash: %d %s, want 409 outcome-unknown", r.status, r.body)
	}
	if r.header.Get("Retry-After") == "" {
		t.Error("409 outcome-unknown without Retry-After")
	}
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
	return second, dsn, api, c
}

// expectReplay checks that the retry replays want and the upstream was
// still called only once.
func expectReplay(t *testing.T, p *proxyProc, api *blockingAPI, c *http.Client, want string) {
	t.Helper()
	for range 2 {
		r, err := post(c, p.base+chargePath, chargeKey, chargeBody)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusCreated || r.body != want || r.header.Get("Idempotent-Replayed") != "true" ||
			r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("retry after the resolution: %d %v %s, want 201 %s replayed", r.status, r.header, r.body, want)
		}
	}
	if n := api.calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

func TestCrashThenOperatorResolves(t *testing.T) {
	t.Parallel()
	p, dsn, api, c := crashMidRequest(t)

	out, errOut, err := runIdem(t, "reconcile", "list", "--store", dsn)
	if err != nil || !strings.Contains(out, `"`+chargeKey+`"`) || !strings.Contains(out, "lease_expired") {
		t.Fatalf("reconcile list: %v\n%s%s", err, out, errOut)
	}
	// The operator settles the execution the list showed: its fence.
	out, errOut, err = runIdem(t, "reconcile", "list", "--json", "--store", dsn)
	var listed struct {
		Fence int64 `json:"fence"`
	}
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || listed.Fence <= 0 {
		t.Fatalf("reconcile list --json: %v\n%s%s", err, out, errOut)
	}
	out, errOut, err = runIdem(t, "reconcile", "resolve", chargeKey, "--store", dsn, "--route", chargePath, "--fence", fmt.Sprint(listed.Fence),
		"--completed", "--status", "201", "--header", "Content-Type: application/json", "--body", `{"id":"x"}`)
	if err != nil || !strings.Contains(out, "completed") {
		t.Fatalf("reconcile resolve: %v\n%s%s", err, out, errOut)
	}
	expectReplay(t, p, api, c, `{"id":"x"}`)

	out, _, err = runIdem(t, "inspect", "--json", "--store", dsn, "--route", chargePath, `"`+chargeKey+`"`)
	if err != nil || !strings.Contains(out, `"state": "completed"`) {
		t.Errorf("inspect: %v\n%s", err, out)
	}
	p.stop(t)
}

func TestCrashThenResolveURL(t *testing.T) {
	t.Parallel()
	p, dsn, api, c := crashMidRequest(t)

	var asked atomic.Value
	resolver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		asked.Store(string(b))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"outcome":"happened","status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"y\"}"}`)
	}))
	defer resolver.Close()

	out, errOut, err := runIdem(t, "reconcile", "run", "--store", dsn, "--resolve-url", resolver.URL+"/resolve")
	if err != nil || out != "resolved 1, deferred 0, dead-lettered 0\n" {
		t.Fatalf("reconcile run: %v\n%s%s", err, out, errOut)
	}
	var q struct {
		Scope, Key, Fingerprint, LastError, Route string
		Fence                                     int64
		CreatedAt                                 time.Time `json:"created_at"`
	}
	raw, _ := asked.Load().(string)
	if err := json.Unmarshal([]byte(raw), &q); err != nil {
		t.Fatalf("question %q: %v", raw, err)
	}
	if q.Key != chargeKey || q.Scope != "0:POST "+chargePath || q.Fence <= 0 || q.Fingerprint == "" ||
		!strings.Contains(raw, `"last_error":"lease_expired"`) || q.Route != chargePath || q.CreatedAt.IsZero() {
		t.Errorf("question %s", raw)
	}
	expectReplay(t, p, api, c, `{"id":"y"}`)
	p.stop(t)
}

func TestBinaryUsage(t *testing.T) {
	t.Parallel()
	out, _, err := runIdem(t, "help")
	if err != nil || !strings.Contains(out, "reconcile") {
		t.Errorf("idem help: %v\n%s", err, out)
	}
	out, _, err = runIdem(t, "--version")
	if err != nil || !strings.HasPrefix(out, "idem ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("idem --version: %v\n%s", err, out)
	}
	out, _, err = runIdem(t, "help", "reconcile", "resolve")
	if err != nil || !strings.HasPrefix(out, "Usage: idem reconcile resolve") || !strings.Contains(out, "Exit status:") {
		t.Errorf("idem help reconcile resolve: %v\n%s", err, out)
	}
	_, errOut, err := runIdem(t, "reconcile", "resolve", "--store", "memory:", "k")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(errOut, "Usage: idem reconcile resolve") {
		t.Errorf("usage error: %v\n%s", err, errOut)
	}
	_, errOut, err = runIdem(t, "sweep", "--store", "sqlite:"+filepath.Join(t.TempDir(), "none.db"))
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(errOut, "does not exist") {
		t.Errorf("failure: %v\n%s", err, errOut)
	}
}

// Without a tenant source the proxy does not start, and says how to fix
// it; a shared store needs the tenant secret given.
func TestBinaryProxyRefusesASharedTenant(t *testing.T) {
	t.Parallel()
	_, errOut, err := runIdem(t, "proxy", "--upstream", "http://127.0.0.1:1", "--store", "memory:", "--listen", "127.0.0.1:0")
	var exit *exec.ExitError
	// A missing tenant source is a usage error: status 2.
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(errOut, "--tenant-from") || !strings.Contains(errOut, "--single-tenant") {
		t.Errorf("proxy without a tenant source: %v\n%s", err, errOut)
	}
	_, errOut, err = runIdem(t, "proxy", "--upstream", "http://127.0.0.1:1", "--store", "postgres://u@127.0.0.1:1/db",
		"--tenant-from", "authorization", "--listen", "127.0.0.1:0")
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(errOut, "IDEM_TENANT_SECRET") {
		t.Errorf("proxy on a shared store without a secret: %v\n%s", err, errOut)
	}
}
