package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
)

// browser starts a headless Chromium for the test, or skips when none is
// installed (fails under CI=true, where the browser is part of the setup).
func browser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no Chromium installed: the console browser test needs one under CI (apt-get install -y chromium)")
		}
		testenv.Skip(t, "no Chromium installed (apt-get install -y chromium): skipping the console browser test")
	}
	// Chromium's helpers may still write in its profile for a moment after
	// it stops, so the profile is removed best-effort, not by t.TempDir.
	dir, err := os.MkdirTemp("", "idem-console-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		// Without these, Chromium's own connections to the internet are
		// refused on a closed network and slow every page.
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(dir),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelT()
		cancelC()
		cancelA()
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return ctx
}

// shot saves a screenshot into docs/console when IDEM_CONSOLE_SCREENSHOTS=1
// (a normal run writes nothing into the repository).
func shot(name string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		if os.Getenv("IDEM_CONSOLE_SCREENSHOTS") != "1" {
			return chromedp.Void{}, nil
		}
		png, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return chromedp.Void{}, err
		}
		dir := filepath.Join("..", "..", "..", "..", "docs", "console") // the repository root's docs
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return chromedp.Void{}, err
		}
		return chromedp.Void{}, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	}
}

// TestConsoleBrowser walks the console in a real browser: a request whose
// upstream hung up is unknown; an operator signs in, finds it by key,
// settles it as completed with an answer (confirmed), and the client's retry
// gets that answer without the upstream being called again.
func TestConsoleBrowser(t *testing.T) {
	ctx := browser(t)
	var calls atomic.Int32
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // received, then gone: the outcome is unknown
		}
	}))
	logs := &safeBuffer{}
	p, base := startProxy(t, ProxyConfig{Upstream: up.URL, Store: "memory:", Admin: "127.0.0.1:0", Console: true,
		TenantFrom:         []string{"authorization"},
		ConsoleCredentials: console.Credentials{Token: "console-token-0123456789abcdef0123456789"},
		Logger:             slog.New(slog.NewJSONHandler(logs, nil))})
	admin := "http://" + p.AdminAddr().String()
	c := client(t)

	sendKey := func(key string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		req.Header.Set("Authorization", "Bearer client-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	send := func() (int, string) { return sendKey("order-42") }
	if code, _ := send(); code < 500 {
		t.Fatalf("request whose upstream hung up: %d, want a 5xx", code)
	}
	if calls.Load() != 1 {
		t.Fatalf("upstream calls: %d", calls.Load())
	}
	// A second unknown request, which the reconciler gave up on.
	if code, _ := sendKey("order-43"); code < 500 {
		t.Fatalf("second request whose upstream hung up: %d, want a 5xx", code)
	}
	tenant, err := p.consoleTenant("Bearer client-1")
	if err != nil {
		t.Fatal(err)
	}
	given, err := p.Store().Get(context.Background(), scopeOf(tenant, "POST", "/v1/charges"), "order-43")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Store().Defer(context.Background(), store.DeferParams{FenceParams: store.FenceParams{Scope: given.Scope, Key: given.Key, Fence: given.Fence},
		DeadLetter: true, Error: "the resolver kept failing"}); err != nil {
		t.Fatal(err)
	}

	must := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		for i, step := range steps {
			if err := chromedp.Do(ctx, step); err != nil {
				t.Fatalf("%s, step %d: %v", what, i, err)
			}
		}
	}
	textOf := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	var text string
	// A wrong token is refused.
	must("wrong token",
		chromedp.Navigate(admin+"/console/"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=token]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name=token]`), "not-the-token"),
		chromedp.Submit(chromedp.CSS(`input[name=token]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.error`)))
	text = textOf(`p.error`)
	if !strings.Contains(text, "wrong credentials") {
		t.Fatalf("wrong token: %q", text)
	}
	must("sign in and search by key",
		chromedp.SendKeys(chromedp.CSS(`input[name=token]`), "console-token-0123456789abcdef0123456789"),
		chromedp.Submit(chromedp.CSS(`input[name=token]`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name=key]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name=key]`), `"order-42"`),
		chromedp.Submit(chromedp.CSS(`input[name=key]`)),
		// The page before the search lists every record: wait for the results.
		chromedp.WaitVisible(chromedp.CSS(`#searching-key`)),
		chromedp.WaitVisible(chromedp.CSS(`table a`)),
		shot("search"))
	text = textOf(`table`)
	if !strings.Contains(text, "order-42") || !strings.Contains(text, "unknown") {
		t.Fatalf("search results: %q", text)
	}
	must("the unknown queue",
		chromedp.Navigate(admin+"/console/unknown"),
		chromedp.WaitVisible(chromedp.CSS(`table a`)),
		shot("unknown"))
	if text = textOf(`table`); !strings.Contains(text, "order-42") || !strings.Contains(text, "Attempts") {
		t.Fatalf("unknown queue: %q", text)
	}
	must("open the record",
		chromedp.Click(chromedp.CSS(`table a`)),
		chromedp.WaitVisible(chromedp.CSS(`#request`)),
		shot("record"))
	text = textOf(`dl`)
	if !strings.Contains(text, "unknown") || !strings.Contains(text, " ago") {
		t.Fatalf("record page: %q", text)
	}
	// The original request, read on the page: method, target, the safe
	// headers and the body; the client's credential is not there.
	text = textOf(`#request`)
	for _, want := range []string{"POST /v1/charges", "Content-Type", "application/json", "Idempotency-Key", `{"amount":100}`} {
		if !strings.Contains(text, want) {
			t.Fatalf("the record page's request lacks %q: %q", want, text)
		}
	}
	if strings.Contains(text, "client-1") || strings.Contains(text, "Authorization") {
		t.Fatalf("the record page shows the client's credential: %q", text)
	}
	must("settle as completed, with a reason",
		chromedp.SetValue(chromedp.CSS(`input[name=status]`), "201"),
		chromedp.SendKeys(chromedp.CSS(`textarea[name=body]`), `{"id":"ch_1","amount":100}`),
		chromedp.Submit(chromedp.CSS(`textarea[name=body]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.SendKeys(chromedp.CSS(`input[name=reason]`), "provider dashboard shows ch_1 captured"),
		shot("confirm"))
	if text = textOf(`#current`); !strings.Contains(text, "unknown") {
		t.Fatalf("the confirmation page does not show the record's state: %q", text)
	}
	must("confirm",
		chromedp.Click(chromedp.CSS(`#confirm`)),
		// The confirmation page has a pre too: wait for the record page.
		chromedp.WaitVisible(chromedp.CSS(`dl .state.completed`)))
	text = textOf(`dl`)
	if !strings.Contains(text, "completed") {
		t.Fatalf("after the confirmation: %q", text)
	}

	code, body := send()
	if code != 201 || body != `{"id":"ch_1","amount":100}` {
		t.Fatalf("retry after settling: %d %q", code, body)
	}
	if calls.Load() != 2 {
		t.Fatalf("the retry called the upstream: %d calls, want the 2 of order-42 and order-43", calls.Load())
	}
	checkAudit(t, logs.String(), c, admin, tenant)

	// The dead letter is on its own page, reached from the navigation, and
	// not in the unknown queue.
	must("the dead letters",
		chromedp.Navigate(admin+"/console/unknown"),
		chromedp.WaitVisible(chromedp.CSS(`nav`)))
	if text = textOf(`main`); strings.Contains(text, "order-43") {
		t.Fatalf("the unknown queue lists the dead letter: %q", text)
	}
	must("open the dead letters",
		chromedp.Click(chromedp.CSS(`nav a[href="/console/dead-letters"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table a`)),
		shot("dead-letters"))
	if text = textOf(`table`); !strings.Contains(text, "order-43") || strings.Contains(text, "order-42") {
		t.Fatalf("dead letters page: %q", text)
	}
	must("run a dead letter again",
		chromedp.Click(chromedp.CSS(`table a`)),
		chromedp.WaitVisible(chromedp.CSS(`form:has(input[value=run_again]) button`)),
		chromedp.Click(chromedp.CSS(`form:has(input[value=run_again]) button`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`dl .state.failed_retryable`)))
	must("the dead letters are empty",
		chromedp.Navigate(admin+"/console/dead-letters"),
		chromedp.WaitVisible(chromedp.CSS(`main p`)))
	if text = textOf(`main`); strings.Contains(text, "order-43") || !strings.Contains(text, "No records") {
		t.Fatalf("dead letters after running it again: %q", text)
	}

	// A POST without the CSRF token is refused, even with valid credentials.
	form := url.Values{"scope": {"x"}, "key": {"y"}, "action": {"delete"}, "confirm": {"yes"}}
	req, _ := http.NewRequest(http.MethodPost, admin+"/console/act", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer console-token-0123456789abcdef0123456789")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("POST without the CSRF token: %d, want 403", resp.StatusCode)
	}
}

// checkAudit checks the audit trail of the walk: the operator's sign-in,
// the settlement of order-42 with who, what, the reason and the record's
// state before and after, in the log and in the actions metric.
func checkAudit(t *testing.T, log string, c *http.Client, admin, tenant string) {
	t.Helper()
	var login, settle map[string]any
	for _, line := range strings.Split(log, "\n") {
		var m map[string]any
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber()
		if d.Decode(&m) != nil {
			continue
		}
		switch {
		case m["msg"] == "idem console: login" && m["result"] == "ok":
			login = m
		case m["msg"] == "idem console: completed":
			settle = m
		}
	}
	if login == nil || settle == nil {
		t.Fatalf("no audit line of the sign-in or the settlement in:\n%s", log)
	}
	want := map[string]string{"level": "INFO", "result": "ok", "operator": "token", "session": fmt.Sprint(login["session"]),
		"scope": scopeOf(tenant, "POST", "/v1/charges"), "key": "order-42", "status": "201",
		"reason": "provider dashboard shows ch_1 captured", "state_before": "unknown", "state_after": "completed"}
	for k, v := range want {
		if fmt.Sprint(settle[k]) != v {
			t.Errorf("settlement audit line: %s = %v, want %q (%v)", k, settle[k], v, settle)
		}
	}
	if fmt.Sprint(settle["fence_before"]) != fmt.Sprint(settle["fence_after"]) || !strings.HasPrefix(fmt.Sprint(settle["remote"]), "127.0.0.1:") {
		t.Errorf("settlement audit line: fences %v/%v, remote %v", settle["fence_before"], settle["fence_after"], settle["remote"])
	}
	if strings.Contains(log, "console-token-0123456789abcdef0123456789") {
		t.Error("the log holds the console token")
	}
	metrics := string(send(t, c, "GET", admin+"/metrics", "", "").body)
	for _, re := range []string{`idem_console_actions_total\{action="completed",[^}]*result="ok"\} 1\n`,
		`idem_console_actions_total\{action="login",[^}]*result="wrong_credentials"\} 1\n`,
		`idem_reconcile_resolved_total(\{[^}]*\})? 1\n`} {
		if !regexp.MustCompile(re).MatchString(metrics) {
			t.Errorf("no %s in:\n%s", re, grepLines(metrics, "idem_console"))
		}
	}
}
