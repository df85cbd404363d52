package httpfield_test

import (
	"net/http"
	"slices"
	"strings"
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

// TestValidBytes checks Valid byte by byte against RFC 9110: a name is made
// of tchars only (letters, digits and !#$%&'*+-.^_`|~), and a value may hold
// any byte but a control character other than horizontal tab, or DEL
// (spaces and obs-text included), so that "Content-MD5", "Authorization" or
// "text/html; charset=utf-8" are kept and replayed.
func TestValidBytes(t *testing.T) {
	const tchar = "!#$%&'*+-.^_`|~0123456789" +
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	for c := range 256 {
		b := string([]byte{byte(c)})
		if got, want := httpfield.Valid("X"+b+"Y", nil), strings.Contains(tchar, b); got != want {
			t.Errorf("Valid(name %q) = %v, want %v", "X"+b+"Y", got, want)
		}
		if got, want := httpfield.Valid("X", []string{"a" + b + "b"}), c == '\t' || c >= 0x20 && c != 0x7f; got != want {
			t.Errorf("Valid(value %q) = %v, want %v", "a"+b+"b", got, want)
		}
	}
}

// An answer is an event stream, sent as it is written and never stored
// first, when its Content-Type is the media type text/event-stream, with
// or without parameters; another type that merely starts with that text is
// not one.
func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                true,
		"text/event-stream; charset=utf-8": true,
		"text/event-streams":               false,
		"text/event-stream; =":             false,
		"text/html":                        false,
		"":                                 false,
	} {
		h := http.Header{}
		if ct != "" {
			h.Set("Content-Type", ct)
		}
		if got := httpfield.IsEventStream(h); got != want {
			t.Errorf("IsEventStream(Content-Type %q) = %v, want %v", ct, got, want)
		}
	}
}
