package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// answered stores a completed record under key with the given answer.
func answered(t *testing.T, s store.Store, key string, resp store.Response) {
	t.Helper()
	fence := reserve(t, s, key, time.Minute, store.LeaseUnknown)
	err := s.Complete(context.Background(), store.CompleteParams{
		FenceParams: store.FenceParams{Scope: testScope, Key: key, Fence: fence}, Response: resp, TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// inspector runs idem inspect on the records of POST /v1/charges in dsn.
func inspector(t *testing.T, dsn string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, errOut, err := run(append([]string{"inspect", "--store", dsn, "--route", "/v1/charges"}, args...)...)
		if err != nil {
			t.Fatalf("inspect %q: %v\n%s", args, err, errOut)
		}
		return out
	}
}

func TestInspectShowsTheAnswer(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	jsonBody := `{"id":"ch_1","amount":4200}`
	answered(t, s, "text-key", store.Response{Status: 201, Body: []byte(jsonBody),
		Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}, "X-Request-Id": {"r1"}}})
	binBody := append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte{0, 1, 2, 0xff}, 40)...)
	answered(t, s, "bin-key", store.Response{Status: 200, Body: binBody, Header: http.Header{"Content-Type": {"image/png"}}})
	// Valid UTF-8, but not under a textual type: shown as binary.
	answered(t, s, "octets", store.Response{Status: 200, Body: []byte("plain words"),
		Header: http.Header{"Content-Type": {"application/octet-stream"}}})
	// No Content-Type: sniffed.
	answered(t, s, "sniffed", store.Response{Status: 200, Body: []byte("hello there\n")})
	unknownRecord(t, s, "pending")

	inspect := inspector(t, dsn)

	t.Run("text", func(t *testing.T) {
		out := inspect("text-key")
		for _, want := range []string{"state:", "completed", `key:`, `"text-key"`, "response: 201 Created\n",
			"Content-Type: application/json; charset=utf-8\n", "X-Request-Id: r1\n", "\n" + jsonBody + "\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("lacks %q:\n%s", want, out)
			}
		}
		// The quoted spelling, with sf-string escapes, names the same record.
		if quoted := inspect(`"text-key"`); quoted != out {
			t.Errorf("quoted key:\n%s", quoted)
		}
		if quoted := inspect(` "text-key";p=1 `); quoted != out {
			t.Errorf("quoted key with a parameter:\n%s", quoted)
		}
		var v recordView
		if err := json.Unmarshal([]byte(inspect("--json", "text-key")), &v); err != nil {
			t.Fatal(err)
		}
		if v.Response == nil || v.Response.Body == nil || *v.Response.Body != jsonBody || v.Response.BodyBase64 != "" ||
			v.Response.Header.Get("X-Request-Id") != "r1" {
			t.Errorf("json: %+v", v.Response)
		}
	})
	t.Run("binary", func(t *testing.T) {
		out := inspect("bin-key")
		for _, want := range []string{"response: 200 OK", "Content-Type: image/png",
			"(binary body: 168 bytes, image/png; write it with --body-out FILE)",
			"00000000  89 50 4e 47 0d 0a 1a 0a  00 01 02 ff 00 01 02 ff  |.PNG............|", "... 104 more bytes"} {
			if !strings.Contains(out, want) {
				t.Errorf("lacks %q:\n%s", want, out)
			}
		}
		var v recordView
		if err := json.Unmarshal([]byte(inspect("--json", "bin-key")), &v); err != nil {
			t.Fatal(err)
		}
		if raw, err := base64.StdEncoding.DecodeString(v.Response.BodyBase64); err != nil || !bytes.Equal(raw, binBody) ||
			v.Response.Body != nil || v.Response.BodyLength != len(binBody) {
			t.Errorf("json body: %+v %v", v.Response, err)
		}
		path := filepath.Join(t.TempDir(), "body.bin")
		inspect("--body-out", path, "bin-key")
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, binBody) {
			t.Errorf("--body-out wrote %q %v", got, err)
		}
		if got := inspect("--body-out", "-", "bin-key"); got != string(binBody) {
			t.Errorf("--body-out - printed %q", got)
		}
		if out := inspect("octets"); !strings.Contains(out, "(binary body: 11 bytes, application/octet-stream;") {
			t.Errorf("octet-stream body:\n%s", out)
		}
		if out := inspect("sniffed"); !strings.Contains(out, "\nhello there\n") {
			t.Errorf("sniffed text body:\n%s", out)
		}
	})
	t.Run("no answer", func(t *testing.T) {
		out := inspect("pending")
		for _, want := range []string{"unknown", "reconcile after:", "last error:", "upstream hung up", "no stored response"} {
			if !strings.Contains(out, want) {
				t.Errorf("lacks %q:\n%s", want, out)
			}
		}
		_, _, err := run("inspect", "--store", dsn, "--route", "/v1/charges", "--body-out", filepath.Join(t.TempDir(), "x"), "pending")
		if err == nil || !strings.Contains(err.Error(), "no stored response") {
			t.Errorf("--body-out of an unknown record: %v", err)
		}
	})
	t.Run("bad keys", func(t *testing.T) {
		for _, key := range []string{`"unterminated`, `two words`, `"a", "b"`, `""`, `"` + strings.Repeat("k", 256) + `"`} {
			_, errOut, err := run("inspect", "--store", dsn, "--route", "/v1/charges", "--", key)
			if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "KEY") {
				t.Errorf("key %q: %v\n%s", key, err, errOut)
			}
		}
	})
}

func TestTextual(t *testing.T) {
	t.Parallel()
	for mt, want := range map[string]bool{
		"text/plain": true, "text/html": true, "application/json": true, "application/problem+json": true,
		"application/vnd.api+json": true, "application/xml": true, "application/atom+xml": true,
		"application/x-www-form-urlencoded": true, "application/octet-stream": false, "image/png": false,
		"application/pdf": false, "application/grpc": false, "": false,
	} {
		if got := textual(mt); got != want {
			t.Errorf("textual(%q) = %v", mt, got)
		}
	}
}

// inspect shows an unknown record's request as the console does: the
// summary the engine kept (credential headers hidden, the body's first
// KiB), or why none is known.
func TestInspectShowsTheKeptRequest(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	s := seeded(t, dsn, time.Now())
	fence := reserve(t, s, "summarised", time.Minute, store.LeaseUnknown)
	body := `{"amount":100,"note":"` + strings.Repeat("n", 1100)
	if err := s.MarkUnknown(context.Background(), store.ReleaseParams{
		FenceParams: store.FenceParams{Scope: testScope, Key: "summarised", Fence: fence}, Error: "upstream hung up",
		Request: &store.PendingRequest{Method: "POST", Target: "/v1/charges?expand=customer", Fence: fence,
			Header: http.Header{"X-Request-Id": {"r-9"}, "X-Api-Key": {"k_live_1"}}, Body: []byte(body), BodyBytes: 3000},
	}); err != nil {
		t.Fatal(err)
	}
	unknownRecord(t, s, "plain")
	inspect := inspector(t, dsn)
	out := inspect("summarised")
	for _, want := range []string{"request (a summary kept when the outcome became unknown, without credentials): POST /v1/charges?expand=customer\n",
		"X-Request-Id: r-9\n", "X-Api-Key: (hidden: may hold a credential)\n", `{"amount":100,"note":"nnn`, "(the first 1024 of 3000 bytes)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect of an unknown record lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "k_live_1") {
		t.Error("inspect shows a credential")
	}
	if out := inspect("plain"); !strings.Contains(out, "request: not recorded: the record was marked unknown without a summary") {
		t.Errorf("inspect of an unknown record without a summary:\n%s", out)
	}
	var v recordView
	if err := json.Unmarshal([]byte(inspect("--json", "summarised")), &v); err != nil {
		t.Fatal(err)
	}
	if r := v.Request; r == nil || r.Method != "POST" || r.BodyLength != 3000 || r.Body == nil || *r.Body != body || r.Header.Get("X-Api-Key") != hiddenValue || r.Whole {
		t.Errorf("inspect --json request: %+v", r)
	}
	v = recordView{}
	if err := json.Unmarshal([]byte(inspect("--json", "plain")), &v); err != nil || v.Request != nil || v.RequestNotRecorded == "" {
		t.Errorf("inspect --json of a record without a summary: %q %v", v.RequestNotRecorded, err)
	}
}
