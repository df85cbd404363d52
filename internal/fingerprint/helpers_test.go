package fingerprint

import (
	"bytes"
	"net/url"
	"slices"
	"strings"
)

// fataler is what the helpers need of *testing.T and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// canonical returns the canonical JSON bytes for body and whether the
// meaning guard fired, bypassing the hash.
func canonical(tb fataler, body []byte) ([]byte, bool, error) {
	tb.Helper()
	s := New(nil).pool.Get().(*state)
	var out bytes.Buffer
	s.w = &out
	if err := s.parse(body); err != nil {
		return nil, false, err
	}
	if _, err := s.emitValue(0, true); err != nil {
		return nil, false, err
	}
	s.flush()
	return out.Bytes(), s.guarded, nil
}

// verbatimOf parses body and reports whether Sum hashes it as sent, its
// own canonical form.
func verbatimOf(tb fataler, body []byte) bool {
	tb.Helper()
	s := New(nil).pool.Get().(*state)
	if err := s.parse(body); err != nil {
		return false
	}
	return s.verbatim()
}

func mustSum(tb fataler, h *Hasher, method, route, contentType, body string, fields ...string) string {
	tb.Helper()
	sum, err := h.Sum(Input{Method: method, Route: route, ContentType: contentType, Body: []byte(body), Fields: fields})
	if err != nil {
		tb.Fatalf("Sum(%q, %q, %q, %q, %q): %v", method, route, contentType, body, fields, err)
	}
	return sum
}

func mustSumInput(tb fataler, h *Hasher, in Input) string {
	tb.Helper()
	sum, err := h.Sum(in)
	if err != nil {
		tb.Fatalf("Sum(%+v): %v", in, err)
	}
	return sum
}

// canonicalTarget returns the canonical form of a request target.
func canonicalTarget(target string) []byte {
	s := New(nil).pool.Get().(*state)
	return s.appendTarget(nil, target)
}

// refPair is a query pair as the reference decoder sees it.
type refPair struct {
	raw        bool
	key, value string
}

// refTarget decodes a target independently of the package, with net/url:
// the path, then the pairs stably sorted by key, a segment that
// url.QueryUnescape rejects (or that holds a ';') kept raw and marked.
func refTarget(target string) (string, []refPair) {
	path, query, _ := strings.Cut(target, "?")
	var pairs []refPair
	for _, seg := range strings.Split(query, "&") {
		if seg == "" {
			continue
		}
		k, v, _ := strings.Cut(seg, "=")
		dk, errK := url.QueryUnescape(k)
		dv, errV := url.QueryUnescape(v)
		if errK != nil || errV != nil || strings.Contains(seg, ";") {
			pairs = append(pairs, refPair{true, k, v})
			continue
		}
		pairs = append(pairs, refPair{false, dk, dv})
	}
	slices.SortStableFunc(pairs, func(a, b refPair) int { return strings.Compare(a.key, b.key) })
	return path, pairs
}
