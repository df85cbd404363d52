package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/appoutbox"
	"github.com/idem-go/idem/internal/testkit/testenv"
)

// TestExamplesRun runs every example command that idem help prints and
// every idem command line of README.md and docs/, as written, except the
// ones that need something outside this machine (a database server, a
// remote API, a file the reader brings): a proxy or a demo that keeps
// running must start and serve, any other command must exit 0.
//
// Two things are changed, both invisible to what an example shows: each
// example runs in an empty directory of its own (so ./idem.db is fresh),
// and the addresses it listens on, with the URLs that point at them, are
// moved to free ports of the same interface, so that examples do not
// fight over :8080. A command that names a record (inspect, delete,
// reconcile resolve) finds an empty store: it must get as far as looking
// the record up and say it has none.
func TestExamplesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process per example")
	}
	bin := idemBinary(t)
	examples := append(helpExamples(t, bin), docExamples(t)...)
	if len(examples) < 30 {
		t.Fatalf("found %d examples, want the help's and the docs'", len(examples))
	}
	api := startAPI(t, bin)
	seeded := seedStore(t, bin)
	ran := 0
	for _, ex := range examples {
		args, env, why := splitCommand(ex.line)
		if why == "" {
			why = outside(args, env, ex.setup)
		}
		if why != "" {
			t.Logf("not run (%s): %s: %s", why, ex.from, ex.line)
			continue
		}
		ran++
		t.Run(ex.from, func(t *testing.T) {
			t.Parallel()
			runExample(t, bin, api, seeded, args, env, ex)
		})
	}
	if ran < 20 {
		t.Errorf("ran %d examples only", ran)
	}
}

// example is a command line and where it was found. setup holds the
// lines of its docs block that write a file it reads (head -c 32
// /dev/urandom | base64 > webhook.secret): run first, in its directory.
type example struct {
	from, line string
	setup      []string
}

// helpExamples returns the examples of every command's help, read from
// the binary as a user reads them.
func helpExamples(t *testing.T, bin string) []example {
	t.Helper()
	var out []example
	var paths []string
	for _, cmd := range helpList(t, bin, "Commands:") {
		paths = append(paths, cmd)
		for _, sub := range helpList(t, bin, "Subcommands:", cmd) {
			paths = append(paths, cmd+" "+sub)
		}
	}
	for _, p := range paths {
		text := helpOf(t, bin, strings.Fields(p)...)
		_, rest, ok := strings.Cut(text, "\nExamples:\n")
		if !ok {
			t.Errorf("idem help %s has no examples", p)
			continue
		}
		rest, _, _ = strings.Cut(rest, "\nExit status:")
		for _, l := range joinContinued(strings.Split(rest, "\n")) {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				out = append(out, example{from: "idem help " + p, line: l})
			}
		}
	}
	return out
}

func helpOf(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"help"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("idem help %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// helpList returns the names listed under heading in a help text.
func helpList(t *testing.T, bin, heading string, args ...string) []string {
	_, rest, ok := strings.Cut(helpOf(t, bin, args...), "\n"+heading+"\n")
	if !ok {
		return nil
	}
	var names []string
	for _, l := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(l, "  ") {
			break
		}
		names = append(names, strings.Fields(l)[0])
	}
	return names
}

// docExamples returns the idem command lines of the sh blocks of README.md
// and docs/.
func docExamples(t *testing.T) []example {
	t.Helper()
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	command := regexp.MustCompile(`^([A-Z_]+=\S+ )*(idem|go run \./cmd/idem) `)
	var out []example
	for _, page := range append(pages, "../../README.md") {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(text), -1) {
			lines := joinContinued(strings.Split(block[1], "\n"))
			var setup []string
			for _, l := range lines {
				if regexp.MustCompile(`^[^#]*> ?[\w.-]+\s*(#.*)?$`).MatchString(l) && !command.MatchString(l) {
					setup = append(setup, l)
				}
			}
			for _, l := range lines {
				if command.MatchString(l) {
					out = append(out, example{strings.TrimPrefix(page, "../../"), strings.Replace(l, "go run ./cmd/idem ", "idem ", 1), setup})
				}
			}
		}
	}
	return out
}

// joinContinued joins lines that end with a backslash to the next.
func joinContinued(lines []string) []string {
	var out []string
	cur := ""
	for _, l := range lines {
		if s, ok := strings.CutSuffix(strings.TrimRight(l, " "), `\`); ok {
			cur += s + " "
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	if cur != "" {
		out = append(out, cur)
	}
	return out
}

// splitCommand splits a command line as sh would, for the quoting the
// examples use: environment assignments, then idem and its arguments. A
// line that needs more of the shell (variables, substitutions, pipes) is
// reported by why.
func splitCommand(line string) (args, env []string, why string) {
	var words []string
	var w strings.Builder
	inWord, quote := false, byte(0)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case quote == '"':
			switch c {
			case '"':
				quote = 0
			case '$', '`':
				return nil, nil, "uses the shell's variables"
			case '\\':
				i++
				w.WriteByte(line[i])
			default:
				w.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(line) // a comment
		case strings.IndexByte("$`|;&<>(){}", c) >= 0:
			return nil, nil, "uses the shell's variables"
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	for len(words) > 0 && regexp.MustCompile(`^[A-Z_]+=`).MatchString(words[0]) {
		env, words = append(env, words[0]), words[1:]
	}
	if len(words) == 0 || words[0] != "idem" {
		return nil, nil, "not an idem command"
	}
	return words[1:], env, ""
}

// outside says what an example needs from outside this machine, or "".
func outside(args, env, setup []string) string {
	for _, a := range append(append([]string(nil), args...), env...) {
		switch {
		case a == "..." || strings.Contains(a, "…"):
			return "a fragment"
		case regexp.MustCompile(`(postgres|postgresql|mysql|rediss?|redis\+cluster)://`).MatchString(a):
			return "a database server"
		case regexp.MustCompile(`^https?://`).MatchString(a) && !regexp.MustCompile(`^https?://(127\.0\.0\.1|localhost)[:/]`).MatchString(a) &&
			(len(args) > 0 && (args[0] == "check" || args[0] == "bench") || strings.Contains(a, "collector")):
			return "a remote API"
		}
	}
	for i, a := range args {
		file := ""
		switch {
		case (a == "--config" || strings.HasSuffix(a, "-file")) && i+1 < len(args):
			file = args[i+1]
		case strings.HasPrefix(a, "@"):
			file = a[1:]
		}
		if file != "" && !writes(setup, file) {
			return "the reader's file " + file
		}
	}
	for i, a := range args {
		if a == "--duration" && i+1 < len(args) {
			if d, err := time.ParseDuration(args[i+1]); err == nil && d > 5*time.Second {
				return "runs for " + args[i+1]
			}
		}
	}
	return ""
}

// seedStore returns a directory holding ./idem.db and its tenant secret as
// the first proxy example leaves them, with the record of one request: key
// order-42 on POST /v1/charges, from the caller "Bearer sk_live_1".
func seedStore(t *testing.T, bin string) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"ch_1"}`))
	}))
	defer up.Close()
	dir, listen := t.TempDir(), testenv.FreeAddr(t)
	p := startIdem(t, bin, dir, []string{"proxy", "--upstream", up.URL, "--tenant-from", "authorization", "--listen", listen}, nil)
	if err := p.serving(listen, ""); err != nil {
		t.Fatalf("seeding proxy: %v\n%s", err, p.output())
	}
	req, _ := http.NewRequest("POST", "http://"+listen+"/v1/charges", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Authorization", "Bearer sk_live_1")
	req.Header.Set("Idempotency-Key", `"order-42"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("seeding request: %v %v", resp, err)
	}
	resp.Body.Close()
	p.stop(t)
	seedOutbox(t, filepath.Join(dir, "idem.db"))
	return dir
}

// seedOutbox leaves in the SQLite database at path an application's
// outbox with one dead message, the charge of key order-42 on POST
// /v1/payments, which a provider refused at its only attempt: what the
// idem outbox examples look at.
func seedOutbox(t *testing.T, path string) {
	t.Helper()
	a := appoutbox.New(t, "sqlite:"+path)
	defer a.Close()
	a.Dead(t, appoutbox.Charge(1))
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// startAPI starts what the check and bench examples load, as the README
// runs it: idem proxy --tenant-from authorization in front of a charges
// API (the one idem demo --keep serves). It returns the proxy's address.
func startAPI(t *testing.T, bin string) string {
	t.Helper()
	demo := startIdem(t, bin, t.TempDir(), []string{"demo", "--keep", "--listen", testenv.FreeAddr(t)}, nil)
	t.Cleanup(func() { demo.stop(t) })
	var upstream string
	deadline := time.Now().Add(60 * time.Second)
	for upstream == "" && time.Now().Before(deadline) {
		if m := regexp.MustCompile(`fake charges API  (http://\S+)`).FindStringSubmatch(demo.output()); m != nil &&
			strings.Contains(demo.output(), "Still running") {
			upstream = m[1]
		}
		time.Sleep(50 * time.Millisecond)
	}
	if upstream == "" {
		t.Fatalf("idem demo --keep did not start:\n%s", demo.output())
	}
	addr := testenv.FreeAddr(t)
	p := startIdem(t, bin, t.TempDir(), []string{"proxy", "--upstream", upstream, "--tenant-from", "authorization", "--listen", addr}, nil)
	if err := p.serving(addr, ""); err != nil {
		t.Fatalf("the API's proxy: %v\n%s", err, p.output())
	}
	t.Cleanup(func() { p.stop(t) })
	return addr
}

type idemProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer // stdout and stderr
	done chan error
}

func (p *idemProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *idemProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func startIdem(t *testing.T, bin, dir string, args, env []string) *idemProc {
	t.Helper()
	p := &idemProc{cmd: exec.Command(bin, args...), done: make(chan error, 1)}
	p.cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") && !strings.HasPrefix(kv, "OTEL_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout = p
	p.cmd.Stderr = p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	return p
}

// serving waits until addr answers HTTP (a GET, which the proxy passes
// through) and, when it is given, the process said ready; or the process
// ended.
func (p *idemProc) serving(addr, ready string) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err
			return errors.New("it exited before serving: " + errString(err))
		default:
		}
		p.mu.Lock()
		said := strings.Contains(p.out.String(), ready)
		p.mu.Unlock()
		if said {
			if resp, err := c.Get("http://" + addr + "/"); err == nil {
				resp.Body.Close()
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("nothing answered on " + addr + " within 60s")
}

func errString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// stop interrupts the process as an operator would and wants a clean exit.
func (p *idemProc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("after SIGTERM: %v\n%s", err, p.output())
		}
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("still running 30s after SIGTERM\n%s", p.output())
	}
}

// moveAddrs gives the addresses an example listens on free ports of the
// same interface (":9090" stays on every interface), and points its URLs
// at 127.0.0.1:8080, the proxy of the check and bench examples, to api.
// It returns the address the proxy serves on.
func moveAddrs(t *testing.T, args, env []string, api string) (listen string) {
	free := func(addr string) string {
		port := testenv.FreeAddr(t)
		_, p, _ := net.SplitHostPort(port)
		if host, _, err := net.SplitHostPort(addr); err == nil && host == "" {
			return ":" + p
		}
		return port
	}
	for i := range args {
		switch {
		case (args[i] == "--listen" || args[i] == "--admin") && i+1 < len(args):
			args[i+1] = free(args[i+1])
			if args[i] == "--listen" {
				listen = args[i+1]
			}
		case strings.Contains(args[i], "127.0.0.1:8080"):
			args[i] = strings.ReplaceAll(args[i], "127.0.0.1:8080", api)
		}
	}
	for i, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == "IDEM_LISTEN" || k == "IDEM_ADMIN" {
			env[i] = k + "=" + free(v)
			if k == "IDEM_LISTEN" {
				listen = env[i][len(k)+1:]
			}
		}
	}
	return listen
}

func runExample(t *testing.T, bin, api, seeded string, args, env []string, ex example) {
	line := ex.line
	dir := t.TempDir()
	if args[0] != "proxy" && args[0] != "demo" {
		copyDir(t, seeded, dir)
	}
	for _, l := range ex.setup {
		cmd := exec.Command("bash", "-c", l)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", l, err, out)
		}
	}
	listen := moveAddrs(t, args, env, api)
	keeps := args[0] == "proxy" || args[0] == "demo" && containsArg(args, "--keep")
	if keeps {
		if listen == "" {
			listen = testenv.FreeAddr(t) // in place of the default, 127.0.0.1:8080
			args = append(args, "--listen", listen)
		}
		p := startIdem(t, bin, dir, args, env)
		dial := listen
		if strings.HasPrefix(dial, ":") {
			dial = "127.0.0.1" + dial
		}
		ready := ""
		if args[0] == "demo" {
			ready = "Still running" // after the tour, which its requests would upset
		}
		if err := p.serving(dial, ready); err != nil {
			t.Fatalf("%s\n%v\n%s", line, err, p.output())
		}
		p.stop(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	namesRecord := args[0] == "inspect" || args[0] == "delete" || len(args) > 1 && args[0] == "reconcile" && args[1] == "resolve"
	var exit *exec.ExitError
	switch {
	case err == nil:
	case namesRecord && errors.As(err, &exit) && exit.ExitCode() == 1 && bytes.Contains(out, []byte(" in scope ")):
		// Ran: the record it names is not there, or not in that state (both
		// answers name the key and its scope; a store that did not open,
		// or a flag refused, exits 1 too and fails here).
	default:
		t.Errorf("%s\n%v\n%s", line, err, out)
	}
}

func containsArg(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}

// writes reports whether one of the setup lines writes file.
func writes(setup []string, file string) bool {
	for _, l := range setup {
		if regexp.MustCompile(`> ?` + regexp.QuoteMeta(file) + `\s*(#.*)?$`).MatchString(l) {
			return true
		}
	}
	return false
}
