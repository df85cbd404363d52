package fingerprint

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestTarget(t *testing.T) {
	t.Parallel()
	equal := [][]string{
		{"/a", "/a?", "/a?&", "/a?&&"},
		{"/a?x=1&y=2", "/a?y=2&x=1", "/a?x=%31&y=2", "/a?%78=1&y=2", "/a?&x=1&&y=2&"},
		{"/a?q=a+b", "/a?q=a%20b"},
		{"/a?a=%41", "/a?a=A"},
		{"/a?k", "/a?k="},
		{"/a?x=1&x=2&y=3", "/a?x=1&y=3&x=2", "/a?y=3&x=1&x=2"},
		{"/a?k=%E2%82%AC", "/a?k=%e2%82%ac", "/a?k=€"},
		{"/a?a=%zz", "/a?a=%zz&"},
		{"", "?"},
	}
	for _, group := range equal {
		want := canonicalTarget(group[0])
		for _, in := range group[1:] {
			if got := canonicalTarget(in); !bytes.Equal(got, want) {
				t.Errorf("%q and %q differ: %q, %q", group[0], in, want, got)
			}
		}
	}
	different := [][2]string{
		{"/v1/orders/1/pay", "/v1/orders/2/pay"},
		{"/refund?amount=5", "/refund?amount=500"},
		{"/a?a=1&b=2", "/a?a=12"},
		{"/a?a=1&b=2", "/a?a=1%26b=2"},
		{"/a?a=1&a=2", "/a?a=2&a=1"},
		{"/a?a=1", "/a?a=1&a=1"},
		{"/a?a=b%3Dc", "/a?a%3Db=c"},
		{"/a?q=%2B", "/a?q=+"},
		{"/a?=a", "/a?a="},
		{"/a?", "/a?="},
		// The path is taken byte for byte.
		{"/a%2Fb", "/a/b"},
		{"/a%41", "/aA"},
		{"/a?b", "/a%3Fb"},
		{"/a", "/a/"},
		{"/a?x", "/ax"},
		// Segments kept as sent never equal a decoded pair or a dropped one.
		{"/a?a=%zz", "/a?a=%25zz"},
		{"/a?a=%zz", "/a"},
		{"/a?a=%zz", "/a?a="},
		{"/a?a%zz=b", "/a?a=%zzb"},
		{"/a?a=1;b=2", "/a?a=1&b=2"},
		{"/a?a=1;b=2", "/a?a=1%3Bb=2"},
		{"/a?a=%7A;", "/a?a=z;"},
		{"/a?a=1%", "/a?a=1%25"},
	}
	for _, p := range different {
		if bytes.Equal(canonicalTarget(p[0]), canonicalTarget(p[1])) {
			t.Errorf("%q and %q share a canonical target", p[0], p[1])
		}
	}
}

// TestTargetInSum: the target is part of the fingerprint, so one key sent
// for another resource or another query is a different request, while
// spellings of one query are one request.
func TestTargetInSum(t *testing.T) {
	t.Parallel()
	h := New(nil)
	in := func(target string) Input {
		return Input{Method: "POST", Route: "/v1/orders/{id}/pay", Target: target, ContentType: jsonType, Body: []byte(`{"amount":5}`)}
	}
	one := mustSumInput(t, h, in("/v1/orders/1/pay"))
	if two := mustSumInput(t, h, in("/v1/orders/2/pay")); one == two {
		t.Error("two resources of one route share a fingerprint")
	}
	if mustSumInput(t, h, in("/v1/orders/1/pay?")) != one {
		t.Error("an empty query differs from no query")
	}
	if mustSumInput(t, h, in("/v1/orders/1/pay?a=5")) == mustSumInput(t, h, in("/v1/orders/1/pay?a=500")) {
		t.Error("two queries share a fingerprint")
	}
	if mustSumInput(t, h, in("/v1/orders/1/pay?a=%41&b=1")) != mustSumInput(t, h, in("/v1/orders/1/pay?b=1&a=A")) {
		t.Error("two spellings of one query differ")
	}
	// A target that would confuse a naive concatenation with the route.
	a := Input{Method: "POST", Route: "/a", Target: "/b", Body: []byte("x")}
	b := Input{Method: "POST", Route: "/a/", Target: "b", Body: []byte("x")}
	if mustSumInput(t, h, a) == mustSumInput(t, h, b) {
		t.Error("route and target bytes run together")
	}
	// The target is never an error, whatever its bytes.
	for _, target := range []string{"/a?%", "/a?%zz=%", "/a?;", "\xff?\xff=\xfe", "?=&=&%00=%00"} {
		mustSumInput(t, h, in(target))
	}
}

// TestTargetMeaningDecides: canonical targets are equal exactly when the
// reference decoding (net/url, stably sorted, undecodable segments kept as
// sent) is equal, so canonicalisation never merges two different decoded
// pair lists, nor splits one.
func TestTargetMeaningDecides(t *testing.T) {
	t.Parallel()
	piece := rapid.SampledFrom([]string{"", "a", "b", "=", "&", "+", "%20", " ", "%41", "A", "%", "%z", "%2", "%25", "%26", "%3D", ";", "%3B", "?", "/", "%2F", "é", "%C3%A9", "\x00", "\xff"})
	gen := rapid.Custom(func(t *rapid.T) string {
		return strings.Join(rapid.SliceOfN(piece, 0, 8).Draw(t, "pieces"), "")
	})
	rapid.Check(t, func(t *rapid.T) {
		a, b := gen.Draw(t, "a"), gen.Draw(t, "b")
		checkTargets(t, a, b)
	})
}

// TestTargetSpellings: every spelling of one decoded pair list (order of
// keys, escapes, '+' or %20, empty segments) has one canonical target.
func TestTargetSpellings(t *testing.T) {
	t.Parallel()
	part := rapid.SampledFrom([]string{"", "a", "b", "a b", "a+b", "=", "&", "%", "é", "\x00", "\xff", ";", "?"})
	pairsGen := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) [2]string {
		return [2]string{part.Draw(t, "k"), part.Draw(t, "v")}
	}), 0, 5)
	rapid.Check(t, func(t *rapid.T) {
		p := pairsGen.Draw(t, "pairs")
		a, b := "/x?"+spellForm(t, p), "/x?"+spellForm(t, p)
		if !bytes.Equal(canonicalTarget(a), canonicalTarget(b)) {
			t.Fatalf("two spellings of %q differ: %q %q", p, a, b)
		}
		checkTargets(t, a, b)
	})
}

func checkTargets(t fataler, a, b string) {
	t.Helper()
	pathA, pairsA := refTarget(a)
	pathB, pairsB := refTarget(b)
	same := pathA == pathB && reflect.DeepEqual(pairsA, pairsB)
	if got := bytes.Equal(canonicalTarget(a), canonicalTarget(b)); got != same {
		t.Fatalf("%q and %q: equal decodings %v (%q %v, %q %v), equal canonical targets %v", a, b, same, pathA, pairsA, pathB, pairsB, got)
	}
}

// FuzzTarget checks canonical targets against the reference decoding and
// that the canonical form is never an error or a panic.
func FuzzTarget(f *testing.F) {
	for _, s := range []string{"/a?x=1&y=2", "/a?y=2&x=1", "/a?a=%41", "/a?a=A", "/a?", "/a", "/a?a=%zz", "/a?a=%25zz", "/a?a=1;b=2", "/v1/orders/1/pay", "?&&=", "/a%3Fb?c+d=%20"} {
		f.Add(s, "/a?a=A")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		checkTargets(t, a, b)
		h := New(nil)
		if _, err := h.Sum(Input{Method: "GET", Route: "/", Target: a}); err != nil {
			t.Fatalf("target %q: %v", a, err)
		}
	})
}
