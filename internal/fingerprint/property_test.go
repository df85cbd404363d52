package fingerprint

import (
	"bytes"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
	"pgregory.net/rapid"
)

// value is a generated JSON document, kept abstract so that it can be
// spelled in many equivalent ways.
type value struct {
	kind  int // 0 null, 1 false, 2 true, 3 number, 4 string, 5 array, 6 object
	mant  int64
	exp   int // number = mant × 10^exp
	str   string
	elems []value
	keys  []string
}

// Small alphabets make equal and near-equal values common, which is where
// collisions would hide. A fresh generator per use: rapid v1.3.0 reads a
// generator's lazily set name without synchronisation, so one shared by
// parallel tests is a data race.
func keyGen() *rapid.Generator[string] {
	return rapid.SampledFrom([]string{"", "a", "b", "A", "aa", "é", "e\u0301", "/", "\"", "\\", "\n", "\x00", "\u2028", "\ufb33", "😂", "\x7f"})
}

func genValue(t *rapid.T, depth int) value {
	kind := rapid.IntRange(0, 6).Draw(t, "kind")
	if depth >= 3 && kind >= 5 {
		kind = 3
	}
	switch kind {
	case 3:
		// At most 15 significant digits and a modest exponent: exactly
		// preserved by RFC 8785, so never guarded.
		v := value{kind: 3, mant: rapid.Int64Range(-999_999_999_999_999, 999_999_999_999_999).Draw(t, "mant"), exp: rapid.IntRange(-40, 40).Draw(t, "exp")}
		if rapid.Bool().Draw(t, "small") {
			v.mant, v.exp = rapid.Int64Range(-3, 3).Draw(t, "smallmant"), rapid.IntRange(-1, 1).Draw(t, "smallexp")
		}
		return v
	case 4:
		if rapid.Bool().Draw(t, "shortstr") {
			return value{kind: 4, str: keyGen().Draw(t, "str")}
		}
		return value{kind: 4, str: rapid.String().Draw(t, "str")}
	case 5:
		n := rapid.IntRange(0, 4).Draw(t, "len")
		v := value{kind: 5}
		for i := 0; i < n; i++ {
			v.elems = append(v.elems, genValue(t, depth+1))
		}
		return v
	case 6:
		v := value{kind: 6, keys: rapid.SliceOfNDistinct(keyGen(), 0, 4, rapid.ID[string]).Draw(t, "keys")}
		for range v.keys {
			v.elems = append(v.elems, genValue(t, depth+1))
		}
		return v
	}
	return value{kind: kind}
}

// spell writes v as JSON, drawing every free choice (whitespace, member
// order, number notation, string escapes) from t.
func spell(t *rapid.T, b *strings.Builder, v value) {
	ws := func() {
		b.WriteString(rapid.SampledFrom([]string{"", "", " ", "\n", "\t", "\r\n  "}).Draw(t, "ws"))
	}
	ws()
	switch v.kind {
	case 0:
		b.WriteString("null")
	case 1:
		b.WriteString("false")
	case 2:
		b.WriteString("true")
	case 3:
		spellNumber(t, b, v.mant, v.exp)
	case 4:
		spellString(t, b, v.str)
	case 5:
		b.WriteByte('[')
		for i, e := range v.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			spell(t, b, e)
		}
		ws()
		b.WriteByte(']')
	case 6:
		b.WriteByte('{')
		order := rapid.Permutation(indices(len(v.keys))).Draw(t, "order")
		for n, i := range order {
			if n > 0 {
				b.WriteByte(',')
			}
			ws()
			spellString(t, b, v.keys[i])
			ws()
			b.WriteByte(':')
			spell(t, b, v.elems[i])
		}
		ws()
		b.WriteByte('}')
	}
	ws()
}

func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func spellNumber(t *rapid.T, b *strings.Builder, mant int64, exp int) {
	if mant == 0 {
		b.WriteString(rapid.SampledFrom([]string{"0", "0.0", "0e7", "0E-3", "0.000"}).Draw(t, "zero"))
		return
	}
	// Pad with zeros to move digits between mantissa and exponent.
	pad := rapid.IntRange(0, 3).Draw(t, "pad")
	digits := strconv.FormatInt(mant, 10) + strings.Repeat("0", pad)
	exp -= pad
	neg := digits[0] == '-'
	digits = strings.TrimPrefix(digits, "-")
	if neg {
		b.WriteByte('-')
	}
	// Place the decimal point somewhere in (or before) the digits.
	point := rapid.IntRange(0, len(digits)).Draw(t, "point")
	exp += len(digits) - point
	if point == 0 {
		b.WriteString("0." + digits)
	} else if point == len(digits) {
		b.WriteString(digits)
	} else {
		b.WriteString(digits[:point] + "." + digits[point:])
	}
	if exp != 0 || rapid.Bool().Draw(t, "zeroexp") {
		b.WriteString(rapid.SampledFrom([]string{"e", "E"}).Draw(t, "e"))
		if exp >= 0 && rapid.Bool().Draw(t, "plus") {
			b.WriteByte('+')
		}
		b.WriteString(strconv.Itoa(exp))
	}
}

func spellString(t *rapid.T, b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		mustEscape := r < 0x20 || r == '"' || r == '\\'
		switch style := rapid.IntRange(0, 3).Draw(t, "esc"); {
		case style == 0 && !mustEscape:
			b.WriteRune(r)
		case style == 1 && strings.ContainsRune("\"\\/\b\f\n\r\t", r):
			b.WriteString(map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[r])
		default:
			format := rapid.SampledFrom([]string{`\u%04x`, `\u%04X`}).Draw(t, "hex")
			if r >= 0x10000 {
				hi, lo := utf16.EncodeRune(r)
				fmt.Fprintf(b, format+format, hi, lo)
			} else {
				fmt.Fprintf(b, format, r)
			}
		}
	}
	b.WriteByte('"')
}

// TestJSONSpellingsAgree: every spelling of one document (whitespace, member
// order, number notation, escapes) has one fingerprint, and its canonical
// form is what gowebpki/jcs produces.
func TestJSONSpellingsAgree(t *testing.T) {
	t.Parallel()
	h := New(nil)
	rapid.Check(t, func(t *rapid.T) {
		v := genValue(t, 0)
		var a, b strings.Builder
		spell(t, &a, v)
		spell(t, &b, v)
		out, guarded, err := canonical(t, []byte(a.String()))
		if err != nil || guarded {
			t.Fatalf("%s: guarded=%v err=%v", a.String(), guarded, err)
		}
		ref, err := jcs.Transform([]byte(a.String()))
		if err != nil || string(ref) != string(out) {
			t.Fatalf("%s:\n got %s\njcs %s (%v)", a.String(), out, ref, err)
		}
		sa := mustSum(t, h, "POST", "/", jsonType, a.String())
		sb := mustSum(t, h, "POST", "/", jsonType, b.String())
		if sa != sb {
			t.Fatalf("two spellings differ:\n%s\n%s", a.String(), b.String())
		}
	})
}

// TestJSONVerbatim: a body that Sum hashes as sent is byte for byte its
// canonical form, so the shortcut never changes a fingerprint; and the
// canonical spelling of a document is recognised as such whenever it holds
// no escape and only numbers of at most 15 significant digits without an
// exponent.
func TestJSONVerbatim(t *testing.T) {
	t.Parallel()
	h := New(nil)
	taken := 0
	rapid.Check(t, func(t *rapid.T) {
		v := genValue(t, 0)
		var a strings.Builder
		spell(t, &a, v)
		ref, err := jcs.Transform([]byte(a.String()))
		if err != nil {
			t.Fatalf("jcs: %v", err)
		}
		for _, body := range [][]byte{[]byte(a.String()), ref} {
			if !verbatimOf(t, body) {
				continue
			}
			out, guarded, err := canonical(t, body)
			if err != nil || guarded || !bytes.Equal(out, body) {
				t.Fatalf("%s is hashed as sent, but its canonical form is %s (guarded=%v, %v)", body, out, guarded, err)
			}
		}
		if verbatimOf(t, ref) {
			taken++
		} else if plainCanonical(ref) {
			t.Fatalf("the canonical form %s is not recognised as one", ref)
		}
		if sa, sr := mustSum(t, h, "POST", "/", jsonType, a.String()), mustSum(t, h, "POST", "/", jsonType, string(ref)); sa != sr {
			t.Fatalf("%s and its canonical form %s differ", a.String(), ref)
		}
	})
	if taken == 0 {
		t.Fatal("no canonical form was hashed as sent")
	}
}

// plainCanonical reports whether a canonical JSON text holds no escape
// and no number with an exponent or more than 15 digits: what verbatim
// recognises.
func plainCanonical(b []byte) bool {
	inString, digits := false, 0
	for _, c := range b {
		switch {
		case c == '\\':
			return false
		case c == '"':
			inString = !inString
		case inString:
		case c == 'e' || c == 'E':
			return false
		case c >= '0' && c <= '9':
			if digits++; digits > 15 {
				return false
			}
		case c == '.' || c == '-':
		default:
			digits = 0
		}
	}
	return true
}

// TestJSONMeaningDecides: two documents share a fingerprint exactly when
// they are the same value (compared through jcs on a plain spelling). The
// second document is a mutation of the first, so most pairs are near-equal.
func TestJSONMeaningDecides(t *testing.T) {
	t.Parallel()
	h := New(nil)
	rapid.Check(t, func(t *rapid.T) {
		v := genValue(t, 0)
		w := mutate(t, v)
		var a, b strings.Builder
		spell(t, &a, v)
		spell(t, &b, w)
		ra, errA := jcs.Transform([]byte(a.String()))
		rb, errB := jcs.Transform([]byte(b.String()))
		if errA != nil || errB != nil {
			t.Fatalf("jcs: %v %v", errA, errB)
		}
		same := string(ra) == string(rb)
		sa := mustSum(t, h, "POST", "/", jsonType, a.String())
		sb := mustSum(t, h, "POST", "/", jsonType, b.String())
		if (sa == sb) != same {
			t.Fatalf("equal values %v but equal fingerprints %v:\n%s\n%s", same, sa == sb, a.String(), b.String())
		}
	})
}

// mutate changes one node of v, or nothing (rarely), so that equal and
// unequal pairs both occur.
func mutate(t *rapid.T, v value) value {
	if (v.kind == 5 || v.kind == 6) && len(v.elems) > 0 && rapid.IntRange(0, 3).Draw(t, "descend") > 0 {
		i := rapid.IntRange(0, len(v.elems)-1).Draw(t, "child")
		elems := append([]value(nil), v.elems...)
		elems[i] = mutate(t, elems[i])
		v.elems = elems
		return v
	}
	switch rapid.IntRange(0, 4).Draw(t, "how") {
	case 0:
		return genValue(t, 2)
	case 1:
		if v.kind == 3 {
			v.mant += rapid.Int64Range(-1, 1).Draw(t, "delta")
			return v
		}
	case 2:
		if v.kind == 4 {
			v.str += keyGen().Draw(t, "suffix")
			return v
		}
	case 3:
		if v.kind == 6 && len(v.keys) > 0 {
			i := rapid.IntRange(0, len(v.keys)-1).Draw(t, "rename")
			k := keyGen().Draw(t, "newkey")
			for _, existing := range v.keys {
				if existing == k {
					return v
				}
			}
			v.keys = append([]string(nil), v.keys...)
			v.keys[i] = k
			return v
		}
	}
	return genValue(t, 2)
}

// TestFormSpellingsAndMeaning: forms spelled differently but decoding to the
// same ordered values share a fingerprint; different values do not.
func TestFormSpellingsAndMeaning(t *testing.T) {
	t.Parallel()
	h := New(nil)
	part := rapid.SampledFrom([]string{"", "a", "b", "a b", "a+b", "=", "&", "%", "é", "\x00", "\xff", ";"})
	pairsGen := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) [2]string {
		return [2]string{part.Draw(t, "k"), part.Draw(t, "v")}
	}), 0, 5)
	rapid.Check(t, func(t *rapid.T) {
		p1, p2 := pairsGen.Draw(t, "p1"), pairsGen.Draw(t, "p2")
		a1, a2, b := spellForm(t, p1), spellForm(t, p1), spellForm(t, p2)
		s1 := mustSum(t, h, "POST", "/", formType, a1)
		if s := mustSum(t, h, "POST", "/", formType, a2); s != s1 {
			t.Fatalf("two spellings of %q differ: %q %q", p1, a1, a2)
		}
		same := reflect.DeepEqual(formValues(p1), formValues(p2))
		if s := mustSum(t, h, "POST", "/", formType, b); (s == s1) != same {
			t.Fatalf("%q and %q: equal values %v, equal fingerprints %v", p1, p2, same, s == s1)
		}
	})
}

func formValues(pairs [][2]string) url.Values {
	v := url.Values{}
	for _, p := range pairs {
		v[p[0]] = append(v[p[0]], p[1])
	}
	return v
}

// spellForm encodes pairs with random escaping, in a random interleaving
// that keeps the order of each key's values.
func spellForm(t *rapid.T, pairs [][2]string) string {
	queues := map[string][]string{}
	var keys []string
	for _, p := range pairs {
		if _, ok := queues[p[0]]; !ok {
			keys = append(keys, p[0])
		}
		queues[p[0]] = append(queues[p[0]], p[1])
	}
	var b strings.Builder
	for len(keys) > 0 {
		i := rapid.IntRange(0, len(keys)-1).Draw(t, "next")
		k := keys[i]
		if b.Len() > 0 || rapid.Bool().Draw(t, "lead") {
			b.WriteString(rapid.SampledFrom([]string{"&", "&&"}).Draw(t, "sep"))
		}
		b.WriteString(escapeForm(t, k))
		v := queues[k][0]
		// An empty key with an empty value needs its '=' to exist at all.
		if v != "" || k == "" || rapid.Bool().Draw(t, "eq") {
			b.WriteByte('=')
			b.WriteString(escapeForm(t, v))
		}
		if queues[k] = queues[k][1:]; len(queues[k]) == 0 {
			keys = append(keys[:i], keys[i+1:]...)
		}
	}
	return b.String()
}

func escapeForm(t *rapid.T, s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		safe := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= utf8.RuneSelf
		switch {
		case c == ' ' && rapid.Bool().Draw(t, "plus"):
			b.WriteByte('+')
		case safe && rapid.Bool().Draw(t, "literal"):
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, rapid.SampledFrom([]string{"%%%02X", "%%%02x"}).Draw(t, "pct"), c)
		}
	}
	return b.String()
}
