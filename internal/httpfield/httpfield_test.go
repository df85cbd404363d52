package httpfield_test

import (
	"net/http"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/idem-go/idem/internal/httpfield"
)

func TestReplayable(t *testing.T) {
	h := http.Header{
		"Content-Type":   {"application/json"},
		"X-Request-Id":   {"abc"},
		"Set-Cookie":     {"s=1"},
		"Date":           {"Mon"},
		"Content-Length": {"3"},
		"Connection":     {"close, X-Private"},
		"X-Private":      {"secret"},
		"X-Bell":         {"a\x07b"},
		"X-Del":          {"a\x7f"},
		"X-Tab":          {"a\tb"},
		"Bad Name":       {"v"},
	}
	got := httpfield.Replayable(h)
	for _, k := range []string{"Content-Type", "X-Request-Id", "X-Tab"} {
		if got.Get(k) == "" {
			t.Errorf("%s dropped", k)
		}
	}
	for _, k := range []string{"Set-Cookie", "Date", "Content-Length", "Connection", "X-Private", "X-Bell", "X-Del", "Bad Name"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s kept", k)
		}
	}
	got.Add("X-Request-Id", "more")
	if len(h["X-Request-Id"]) != 1 {
		t.Error("an Add on the copy wrote into the original")
	}
	if httpfield.Replayable(nil) != nil {
		t.Error("nil header: want nil")
	}
}

func TestIsReplayable(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"s=1"}, "Connection": {"X-Private"}, "X-Private": {"1"}}
	r := httpfield.Replayable(h)
	same := http.Header{"Content-Type": {"application/json"}, "Date": {"Tue"}}
	for _, c := range []struct {
		name string
		r, h http.Header
		want bool
	}{
		{"itself", r, h, true},
		{"same replayable fields", r, same, true},
		{"another value", r, http.Header{"Content-Type": {"text/plain"}}, false},
		{"a field more", r, http.Header{"Content-Type": {"application/json"}, "X-A": {"1"}}, false},
		{"a field less", r, http.Header{"Date": {"Tue"}}, false},
		{"a second value", r, http.Header{"Content-Type": {"application/json", "x"}}, false},
		{"nothing kept, empty kept", httpfield.Replayable(http.Header{"Date": {"Tue"}}), http.Header{"Set-Cookie": {"a"}}, true},
		{"no header", nil, nil, true},
		{"no header, kept one", r, nil, false},
		{"a header, kept none", nil, http.Header{"Date": {"Tue"}}, false},
	} {
		if got := httpfield.IsReplayable(c.r, c.h); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// Names are judged in their canonical form: net/http sends a map key as
// written, and clients read names without regard to case.
func TestOtherSpellings(t *testing.T) {
	h := http.Header{
		"set-cookie":        {"s=1"},
		"CONTENT-LENGTH":    {"3"},
		"transfer-encoding": {"chunked"},
		"connection":        {"x-private"},
		"Connection":        {"X-Other"},
		"X-Private":         {"secret"},
		"x-other":           {"secret"},
		"x-kept":            {"yes"},
	}
	got := httpfield.Replayable(h)
	//lint:ignore SA1008 the field was written under this spelling, which it keeps
	if len(got) != 1 || got["x-kept"] == nil {
		t.Fatalf("kept %v, want x-kept alone, as spelled", got)
	}
	if !httpfield.IsReplayable(got, h) {
		t.Error("IsReplayable disagrees with Replayable")
	}
	for _, n := range []string{"set-cookie", "SET-COOKIE", "date", "Keep-alive", "idempotent-replayed"} {
		if httpfield.ReplayableName(n) {
			t.Errorf("ReplayableName(%q) = true", n)
		}
	}
	if !httpfield.ReplayableName("x-kept") || !httpfield.ReplayableName("Content-Type") {
		t.Error("an ordinary name judged unreplayable")
	}
	if c := httpfield.Connection(h); len(c) != 2 {
		t.Errorf("Connection found %q, want the values of both spellings", c)
	}
}

// TestReplayableNameAgreesWithCanonicalForm checks ReplayableName against
// its definition, the canonical form's membership in the unreplayable set:
// for every spelling of the unreplayable names that differs in the case of
// one or two letters, and for arbitrary strings of letters, dashes and
// bytes outside a token.
func TestReplayableNameAgreesWithCanonicalForm(t *testing.T) {
	unreplayable := []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Set-Cookie", "Set-Cookie2",
		"Date", "Content-Length", "Idempotent-Replayed", "Idempotent-Body-Omitted"}
	check := func(t interface{ Fatalf(string, ...any) }, name string) {
		want := !slices.Contains(unreplayable, http.CanonicalHeaderKey(name))
		if got := httpfield.ReplayableName(name); got != want {
			t.Fatalf("ReplayableName(%q) = %v, want %v", name, got, want)
		}
	}
	flip := func(b []byte, i int) {
		if c := b[i] | 0x20; 'a' <= c && c <= 'z' {
			b[i] ^= 0x20
		}
	}
	for _, base := range unreplayable {
		for i := range base {
			for j := i; j < len(base); j++ {
				b := []byte(base)
				flip(b, i)
				if j > i {
					flip(b, j)
				}
				check(t, string(b))
			}
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		check(t, rapid.StringOfN(rapid.SampledFrom([]rune("aZtE-_ 2é\x00")), 0, 12, -1).Draw(t, "name"))
	})
}
