package fingerprint

import (
	"bytes"
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

func mustSum(tb fataler, h *Hasher, method, route, contentType, body string, fields ...string) string {
	tb.Helper()
	sum, err := h.Sum(method, route, contentType, []byte(body), fields)
	if err != nil {
		tb.Fatalf("Sum(%q, %q, %q, %q, %q): %v", method, route, contentType, body, fields, err)
	}
	return sum
}
