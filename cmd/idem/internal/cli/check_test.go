package cli

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// delayed makes h take d per request, so that duplicates meet in flight.
func delayed(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		h.ServeHTTP(w, r)
	})
}

// slowCharges is an upstream that makes a new charge per call (with a
// Set-Cookie), slowly enough for duplicates to find it in flight.
func slowCharges(t *testing.T) *httptest.Server {
	return newUpstream(t, delayed(&chargeAPI{}, 100*time.Millisecond))
}

// checkLine returns the verdict and detail that idem check printed for
// the named check.
func checkLine(t *testing.T, out, name string) (verdict, detail string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 2 && f[1] == name && i+1 < len(lines) {
			return f[0], strings.TrimSpace(lines[i+1])
		}
	}
	t.Fatalf("no line for check %s in:\n%s", name, out)
	return "", ""
}

func TestCheckPassesAgainstTheProxy(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		proxy ProxyConfig
		args  []string
		want  string
	}{
		{"ietf", ProxyConfig{Store: "memory:", TenantFrom: []string{"authorization"}}, []string{"--other-auth", "Bearer other", "--header", "Authorization: Bearer main"}, "11 checks: 11 passed"},
		{"tenant header", ProxyConfig{Store: "memory:", TenantHeader: "X-Tenant-ID"},
			[]string{"--tenant-header", "X-Tenant-ID", "--header", "X-Tenant-ID: main"}, "11 checks: 11 passed"},
		{"stripe", ProxyConfig{Store: "sqlite:", TenantFrom: []string{"authorization"}, Config: idem.Config{Profile: "stripe"}},
			[]string{"--profile", "stripe", "--other-auth", "Bearer other", "--header", "Authorization: Bearer main", "--concurrency", "4"}, "11 checks: 11 passed"},
		{"no tenant and a text body", ProxyConfig{Store: "memory:"},
			[]string{"--body", "@" + writeTemp(t, "plain text"), "--header", "Content-Type: text/plain"},
			"11 checks: 9 passed, 0 failed, 0 warnings, 2 skipped"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.proxy.Store == "sqlite:" {
				tc.proxy.Store += filepath.Join(t.TempDir(), "idem.db")
			}
			tc.proxy.Upstream = slowCharges(t).URL
			_, base := startProxy(t, tc.proxy)
			out, _, err := run(append([]string{"check", base + "/v1/charges"}, tc.args...)...)
			t.Log("\n" + out)
			if err != nil {
				t.Fatalf("check: %v", err)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("want %q in the summary", tc.want)
			}
		})
	}
}

func writeTemp(t *testing.T, content string) string {
	path := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCheckFailsWithoutIdempotency(t *testing.T) {
	t.Parallel()
	up := slowCharges(t)
	out, _, err := run("check", up.URL+"/v1/charges", "--other-auth", "Bearer other")
	t.Log("\n" + out)
	if !errors.Is(err, errChecksFailed) {
		t.Fatalf("check of a plain API: %v, want errChecksFailed", err)
	}
	want := []struct{ check, verdict, detail string }{
		{"replay", "FAIL", "the request ran again"},
		{"mismatch", "FAIL", "ran the second body under the first body's key"},
		{"concurrent", "FAIL", "it ran more than once"},
		{"retry-after", "SKIP", "no 409"},
		{"missing-key", "FAIL", "the API ran a request with no key"},
		{"malformed-key", "FAIL", "256 characters: got 201"},
		{"repeated-key", "FAIL", "two keys on two lines: got 201"},
		{"spelling", "FAIL", "the bare spelling is a different key"},
		{"get-passthrough", "PASS", ""},
		{"no-set-cookie", "SKIP", "not a replay"},
		{"tenants", "FAIL", "tenant A's retry does not replay"},
	}
	for _, w := range want {
		v, d := checkLine(t, out, w.check)
		if v != w.verdict || !strings.Contains(d, w.detail) {
			t.Errorf("%s: %s %q, want %s containing %q", w.check, v, d, w.verdict, w.detail)
		}
	}
	if !strings.Contains(err.Error(), "replay, mismatch, concurrent, missing-key") {
		t.Errorf("error does not name the failed checks: %v", err)
	}
}

// tamper serves h, then lets edit change the answer: a broken
// implementation made from a correct one.
func tamper(h http.Handler, edit func(status int, hdr http.Header, body []byte) []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		res := rec.Result()
		hdr := res.Header.Clone()
		body := edit(res.StatusCode, hdr, rec.Body.Bytes())
		hdr.Del("Content-Length")
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.WriteHeader(res.StatusCode)
		w.Write(body)
	})
}

func TestCheckCatchesBrokenImplementations(t *testing.T) {
	t.Parallel()
	replayed := func(h http.Header) bool { return h.Get("Idempotent-Replayed") == "true" }
	cases := []struct {
		name   string
		proxy  ProxyConfig
		edit   func(status int, hdr http.Header, body []byte) []byte
		args   []string
		check  string
		detail string
	}{
		{name: "replays a different body", edit: func(_ int, h http.Header, b []byte) []byte {
			if replayed(h) {
				return []byte(`{"id":"ch_other"}`)
			}
			return b
		}, check: "replay", detail: "the replay differs from the first answer"},
		{name: "409 without Retry-After", edit: func(status int, h http.Header, b []byte) []byte {
			if status == http.StatusConflict {
				h.Del("Retry-After")
			}
			return b
		}, check: "retry-after", detail: "had no valid Retry-After"},
		{name: "replay leaks Set-Cookie", edit: func(_ int, h http.Header, b []byte) []byte {
			if replayed(h) {
				h.Set("Set-Cookie", "session=first-caller")
			}
			return b
		}, check: "no-set-cookie", detail: "the replay carries Set-Cookie: session=first-caller"},
		{name: "no replay marker", edit: func(_ int, h http.Header, b []byte) []byte {
			h.Del("Idempotent-Replayed")
			return b
		}, check: "replay", detail: "not marked Idempotent-Replayed"},
		{name: "tenants share keys", args: []string{"--tenant-header", "X-Tenant-ID"},
			check: "tenants", detail: "got 422 key-reused: the tenants share keys"},
		{name: "stripe answers under ietf", proxy: ProxyConfig{Config: idem.Config{Profile: "stripe"}},
			check: "missing-key", detail: "want 400: the API ran a request with no key"},
		{name: "stripe mismatch under ietf", proxy: ProxyConfig{Config: idem.Config{Profile: "stripe"}},
			check: "mismatch", detail: "got 400 key-reused, want 422"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.proxy.Store = "memory:"
			tc.proxy.Upstream = slowCharges(t).URL
			p, base := startProxy(t, tc.proxy)
			if tc.edit != nil {
				s := httptest.NewServer(tamper(p.Handler(), tc.edit))
				t.Cleanup(s.Close)
				base = s.URL
			}
			out, _, err := run(append([]string{"check", base + "/v1/charges"}, tc.args...)...)
			t.Log("\n" + out)
			v, d := checkLine(t, out, tc.check)
			want := "FAIL"
			if tc.name == "no replay marker" {
				want = "WARN"
			}
			if v != want || !strings.Contains(d, tc.detail) {
				t.Errorf("%s: %s %q, want %s containing %q", tc.check, v, d, want, tc.detail)
			}
			if (want == "FAIL") != errors.Is(err, errChecksFailed) {
				t.Errorf("check returned %v", err)
			}
		})
	}
}

func TestCheckUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"check"},
		{"check", "localhost:8080"},
		{"check", "http://a", "http://b"},
		{"check", "http://127.0.0.1:1", "--profile", "paypal"},
		{"check", "http://127.0.0.1:1", "--concurrency", "1"},
		{"check", "http://127.0.0.1:1", "--header", "no colon"},
		{"check", "http://127.0.0.1:1", "--body", "{}", "--alt-body", "{}"},
	} {
		if _, _, err := run(args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want ErrUsage", args, err)
		}
	}
	out, _, err := run("help")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"check", "bench", "demo"} {
		if !strings.Contains(out, "  "+c+" ") {
			t.Errorf("usage does not list %s", c)
		}
	}
}

func TestAlterJSON(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"currency":"eur","amount":1000}`: `{"amount":1001,"currency":"eur"}`,
		`{"a":{"b":"x"},"c":1}`:            `{"a":{"b":"x-alt"},"c":1}`,
		`{"ok":true}`:                      `{"ok":false}`,
		`{"n":null}`:                       `{"n":"idem-check-alt"}`,
		`{"x":1.5}`:                        `{"x":4}`,
		`{"big":123456789012345678901234}`: `{"big":2.4691357802469137e+23}`,
		`{}`:                               `{"idem_check_alt":true}`,
		`[]`:                               `["idem-check-alt"]`,
		`"s"`:                              `"s-alt"`,
	} {
		got, ok := alterJSON([]byte(in))
		if !ok || string(got) != want {
			t.Errorf("alterJSON(%s) = %s, %v; want %s", in, got, ok, want)
		}
		if ok && !json.Valid(got) {
			t.Errorf("alterJSON(%s) = %s: not JSON", in, got)
		}
	}
	for _, in := range []string{"", "plain text", `{"a":1} {"b":2}`, `{"a":`} {
		if got, ok := alterJSON([]byte(in)); ok {
			t.Errorf("alterJSON(%q) = %s, want not JSON", in, got)
		}
	}
}

// A check passes only on what it saw: an API that refused the request
// itself, or the second tenant's credential, proves nothing about keys.
func TestCheckPassesNothingItDidNotSee(t *testing.T) {
	t.Parallel()
	t.Run("second tenant refused", func(t *testing.T) {
		t.Parallel()
		up := slowCharges(t)
		authorized := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer main" {
				http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
				return
			}
			up.Config.Handler.ServeHTTP(w, r)
		})
		_, base := startProxy(t, ProxyConfig{Store: "memory:", TenantFrom: []string{"authorization"},
			Upstream: newUpstream(t, authorized).URL})
		out, _, err := run("check", base+"/v1/charges", "--header", "Authorization: Bearer main", "--other-auth", "Bearer revoked")
		t.Log("\n" + out)
		if v, d := checkLine(t, out, "tenants"); v != "FAIL" || !strings.Contains(d, "tenant B's request was refused (401") {
			t.Errorf("tenants: %s %q, want FAIL: tenant B's request was refused", v, d)
		}
		if !errors.Is(err, errChecksFailed) {
			t.Errorf("check returned %v", err)
		}
	})
	t.Run("every request refused", func(t *testing.T) {
		t.Parallel()
		up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"amount is required"}`, http.StatusBadRequest)
		}))
		out, _, err := run("check", up.URL+"/v1/charges")
		t.Log("\n" + out)
		for _, name := range []string{"missing-key", "malformed-key", "repeated-key"} {
			if v, d := checkLine(t, out, name); v != "SKIP" || !strings.Contains(d, "refused every request under a valid key") {
				t.Errorf("%s: %s %q, want SKIP: the API refused every request", name, v, d)
			}
		}
		if !errors.Is(err, errChecksFailed) {
			t.Errorf("check returned %v", err)
		}
	})
}
