package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

var jsonSeeds = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-1.5e-7`, `{"a":1,"b":[1,2,3]}`, `["😀"]`,
	`{"\u0000":"\u001f"}`, `[1e21,1e-6,5e-324,1.7976931348623157e308]`, `{"b":{"a":[{},[]]}}`,
	"[\"caf\xc3\xa9\"]", `  {"a" : 1}  `, `{"\ufb33":1,"\ud83d\ude02":2}`, `"\ud800"`, `"\udc00"`,
	`12345678901234567890`, `0.1000000000000000055511151231257827`, `-0`, `1e-400`, `1e400`,
	`{"a":1,"\u0061":2}`, `[01]`, `[1.]`, `[.5]`, `[+1]`, "\"\xff\"", `"\/\b\f\n\r\t\"\\"`,
	`[1.50,15E-1,0.000001,1e-7,100e-2]`, `{"amount":2000,"currency":"usd","capture":true}`,
	`[[[[[[[[[[]]]]]]]]]]`, `{"a":{"a":{"a":{}}}}`, `9007199254740993`, `1152921504606846976`,
}

// FuzzCanonicalJSON compares the canonicaliser with gowebpki/jcs, the
// reference: on every input it accepts without guarding a number, the bytes
// must be equal; it must reject whatever jcs rejects (except out-of-range
// numbers, which it guards instead) and accept whatever jcs accepts (except
// nesting between MaxDepth and jcs's own limit); and everything it accepts
// must be JSON to encoding/json.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, guarded, err := canonical(t, data)
		ref, refErr := jcs.Transform(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrDuplicateKey) {
				t.Fatalf("unexpected error kind %v for %q", err, data)
			}
			if refErr == nil && !strings.Contains(err.Error(), "nested too deep") {
				t.Fatalf("rejected %q (%v), jcs accepts it as %q", data, err, ref)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted %q, encoding/json rejects it", data)
		}
		verbatim := verbatimOf(t, data)
		if verbatim && (guarded || !bytes.Equal(out, data)) {
			t.Fatalf("%q is hashed as sent, but its canonical form is %q (guarded=%v)", data, out, guarded)
		}
		if guarded {
			return
		}
		if refErr != nil {
			t.Fatalf("accepted %q as %q, jcs rejects it: %v", data, out, refErr)
		}
		if !bytes.Equal(out, ref) {
			t.Fatalf("canonical form of %q:\n got %q\njcs %q", data, out, ref)
		}
		again, guarded, err := canonical(t, out)
		if err != nil || guarded || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q (guarded=%v, %v)", data, out, again, guarded, err)
		}
	})
}

// FuzzCanonicalNumber checks the number shortcuts against their references:
// isCanonicalNumber against jcs.NumberToJSON, emitNumber's decisions from
// the digits alone against a full conversion, and sameDecimal against exact
// rational arithmetic.
func FuzzCanonicalNumber(f *testing.F) {
	for _, s := range []string{"0", "-0", "1", "-1.5", "0.000001", "0.0000001", "123456789012345", "1234567890123456",
		"0.1", "1.0", "1e5", "1E+5", "100", "0.0000015", "999999999999999", "0.100000000000001", "5e-324", "12345678901234567890", "4e-324", "2.4e-324",
		"1e-323", "2.2250738585072011e-308", "1.7976931348623158e308", "-0.0", "0.30000000000000004"} {
		f.Add(s, "1")
	}
	f.Add("\x80123.450e-3", "")
	f.Add("9999999999999999.9", "x")
	f.Fuzz(func(t *testing.T, a, b string) {
		if !isJSONNumber(a) {
			a = toNumber(a)
		}
		if isCanonicalNumber([]byte(a)) {
			v, err := strconv.ParseFloat(a, 64)
			if err != nil {
				t.Fatalf("%q: %v", a, err)
			}
			if canon, _ := jcs.NumberToJSON(v); canon != a {
				t.Fatalf("isCanonicalNumber(%q) but NumberToJSON gives %q", a, canon)
			}
		}
		// The shortcuts of emitNumber decide as a full conversion would.
		got, guarded, err := canonical(t, []byte(a))
		if err != nil {
			t.Fatalf("%q: %v", a, err)
		}
		if ref, refGuarded := refNumber(a); guarded != refGuarded || string(got) != ref {
			t.Fatalf("%q canonicalises to %q guarded=%v; a full conversion gives %q guarded=%v", a, got, guarded, ref, refGuarded)
		}
		if !isJSONNumber(b) {
			// Compare a with its own canonical form instead.
			v, err := strconv.ParseFloat(a, 64)
			if err != nil {
				return
			}
			b, _ = jcs.NumberToJSON(v)
		}
		ra, okA := exactRat(a)
		rb, okB := exactRat(b)
		if !okA || !okB {
			return
		}
		want := ra.Cmp(rb) == 0 && (ra.Sign() != 0 || strings.HasPrefix(a, "-") == strings.HasPrefix(b, "-"))
		if got := sameDecimal(a, b); got != want {
			t.Fatalf("sameDecimal(%q, %q) = %v, want %v", a, b, got, want)
		}
	})
}

// toNumber maps arbitrary fuzz input onto the JSON number grammar, so the
// fuzzer explores numbers rather than syntax errors: an optional '-', digits,
// an optional fraction and an optional exponent, each driven by the bytes.
func toNumber(s string) string {
	var b strings.Builder
	part := 0 // 0 integer, 1 fraction, 2 exponent
	digits := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 0 && c&0x80 != 0:
			b.WriteByte('-')
		case c == '.' && part == 0 && digits > 0:
			b.WriteByte('.')
			part, digits = 1, 0
		case (c == 'e' || c == 'E' || c == '+' || c == '-') && part < 2 && digits > 0:
			b.WriteByte('e')
			if c == '-' || c == '+' {
				b.WriteByte(c)
			}
			part, digits = 2, 0
		default:
			d := '0' + c%10
			if part == 0 && digits == 1 && strings.HasSuffix(b.String(), "0") {
				continue // no leading zeros
			}
			b.WriteByte(d)
			digits++
		}
	}
	if digits == 0 {
		b.WriteByte('0')
	}
	return b.String()
}

func isJSONNumber(s string) bool {
	p := parser{src: []byte(s)}
	return len(s) > 0 && (s[0] == '-' || s[0] >= '0' && s[0] <= '9') && p.number() == nil && p.pos == len(s)
}

// exactRat parses a number whose exponent is small enough for big.Rat to be
// cheap.
func exactRat(s string) (*big.Rat, bool) {
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || e > 2000 || e < -2000 {
			return nil, false
		}
	}
	if len(s) > 2000 {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(strings.Replace(s, "E", "e", 1))
	return r, ok
}

// FuzzSum checks that Sum never panics, returns only its documented errors,
// and is deterministic, over every kind of body, with fields and targets.
func FuzzSum(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add(uint8(0), []byte(s), "a", "/x?a=1")
	}
	for _, s := range []string{"a=1&b=2", "a=%zz", "a;b", "=&=", "a+b=%2B"} {
		f.Add(uint8(1), []byte(s), "a", "/x?"+s)
	}
	f.Add(uint8(0), []byte(`{"a":{"b":[1]}}`), "a.b", "/x")
	types := []string{jsonType, formType, "", "application/problem+json; charset=utf-8", "multipart/form-data"}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte, field, target string) {
		ct := types[int(kind)%len(types)]
		h := New(nil)
		for _, fields := range [][]string{nil, {field}, {field, "a", field}} {
			in := Input{Method: "POST", Route: "/x", Target: target, ContentType: ct, Body: body, Fields: fields}
			sum, err := h.Sum(in)
			if err != nil {
				if !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrDuplicateKey) && !errors.Is(err, ErrInvalidForm) {
					t.Fatalf("undocumented error %v", err)
				}
				continue
			}
			again, err := h.Sum(in)
			if err != nil || again != sum {
				t.Fatalf("not deterministic: %s then %s, %v", sum, again, err)
			}
		}
	})
}

// FuzzForm compares form parsing with net/url.ParseQuery, whose result is
// what a Go handler sees: both must reject the same bodies, decode the same
// pairs, and two bodies must share a fingerprint exactly when ParseQuery
// gives them equal values (in order).
func FuzzForm(f *testing.F) {
	for _, s := range []string{"a=1&b=2", "b=2&a=1", "a=1&a=2", "a=2&a=1", "a=%zz", "a;b", "=&=", "a+b=%2B", "a", "a=", "&&", "%E2%82%AC=1"} {
		f.Add(s, "a=1")
	}
	h := New(nil)
	f.Fuzz(func(t *testing.T, a, b string) {
		sa, errA := h.Sum(Input{Method: "POST", Route: "/", ContentType: formType, Body: []byte(a)})
		va, refErrA := url.ParseQuery(a)
		if (errA != nil) != (refErrA != nil) {
			t.Fatalf("%q: error %v, net/url error %v", a, errA, refErrA)
		}
		sb, errB := h.Sum(Input{Method: "POST", Route: "/", ContentType: formType, Body: []byte(b)})
		vb, refErrB := url.ParseQuery(b)
		if errA != nil || errB != nil || refErrB != nil {
			return
		}
		if got := pairsOf(t, a); !reflect.DeepEqual(got, va) {
			t.Fatalf("%q decodes to %v, net/url gives %v", a, got, va)
		}
		if (sa == sb) != reflect.DeepEqual(va, vb) {
			t.Fatalf("%q and %q: equal fingerprints %v, net/url values %v and %v", a, b, sa == sb, va, vb)
		}
	})
}

func pairsOf(tb testing.TB, body string) url.Values {
	tb.Helper()
	s := New(nil).pool.Get().(*state)
	if err := parsePairs(s, body, false); err != nil {
		tb.Fatal(err)
	}
	v := url.Values{}
	for _, p := range s.pairs {
		k := string(s.bytes(p.key))
		v[k] = append(v[k], string(s.bytes(p.value)))
	}
	return v
}

func TestToNumber(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "abc", "\x80", "00", "0.", ".5", "1e", "1.2.3e4e5", "\xff9.9e-9", "-", "e", "1-2", "0000.0001"} {
		if n := toNumber(s); !isJSONNumber(n) {
			t.Errorf("toNumber(%q) = %q, not a JSON number", s, n)
		}
	}
}
