package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"pgregory.net/rapid"
)

func TestNestedFields(t *testing.T) {
	t.Parallel()
	h := New(nil)
	sum := func(body string, fields ...string) string {
		return mustSum(t, h, "POST", "/", jsonType, body, fields...)
	}
	base := sum(`{"payment":{"amount":100,"currency":"usd"},"nonce":1}`, "payment.amount")
	if sum(`{"nonce":2,"payment":{"currency":"eur","amount":1e2}}`, "payment.amount") != base {
		t.Error("an unselected member changed the fingerprint")
	}
	if sum(`{"payment":{"amount":101,"currency":"usd"},"nonce":1}`, "payment.amount") == base {
		t.Error("the selected nested member changed and the fingerprint did not")
	}
	// A top-level member beside a nested one.
	same := [][2]string{
		{`{"id":1,"payment":{"amount":5}}`, `{"payment":{"x":[1],"amount":5},"id":1.0}`},
		// What is not an object on the path is selected whole, so equal
		// values there agree whatever else changes.
		{`{"id":1,"payment":"card","other":1}`, `{"id":1,"payment":"card","other":2}`},
	}
	for _, p := range same {
		if sum(p[0], "id", "payment.amount") != sum(p[1], "id", "payment.amount") {
			t.Errorf("%s and %s differ", p[0], p[1])
		}
	}
	different := [][2]string{
		// A missing path differs from null, at every level.
		{`{"id":1,"payment":{"amount":null}}`, `{"id":1,"payment":{}}`},
		{`{"id":1,"payment":{}}`, `{"id":1}`},
		{`{"id":1,"payment":null}`, `{"id":1}`},
		{`{"id":1,"payment":null}`, `{"id":1,"payment":{"amount":null}}`},
		// Non-object intermediates are selected whole.
		{`{"id":1,"payment":"card_1"}`, `{"id":1,"payment":"card_2"}`},
		{`{"id":1,"payment":"card_1"}`, `{"id":1}`},
		{`{"id":1,"payment":[{"amount":1}]}`, `{"id":1,"payment":[{"amount":2}]}`},
		{`{"id":1,"payment":[]}`, `{"id":1,"payment":{}}`},
		// A value at the end of the path differs from the same value met
		// on the way.
		{`{"id":1,"payment":{"amount":"x"}}`, `{"id":1,"payment":"x"}`},
	}
	for _, p := range different {
		if sum(p[0], "id", "payment.amount") == sum(p[1], "id", "payment.amount") {
			t.Errorf("%s and %s share a fingerprint", p[0], p[1])
		}
	}
	// Levels of absence: {"a":{}} lacks a.b.c at level 1, {"a":{"b":{}}} at 2.
	if sum(`{"id":1,"a":{}}`, "id", "a.b.c") == sum(`{"id":1,"a":{"b":{}}}`, "id", "a.b.c") {
		t.Error("absence at two levels shares a fingerprint")
	}
	if sum(`{"id":1,"a":{"b":1}}`, "id", "a.b.c") == sum(`{"id":1,"a":{"b":{"c":1}}}`, "id", "a.b.c") {
		t.Error("a non-object at level 2 equals the value found at the end")
	}
	// With none of the paths found the body is fingerprinted whole.
	for _, body := range []string{`{"payment":{"x":1}}`, `{"payment":"card"}`, `{"payment":null}`, `{}`, `[{"payment":{"amount":1}}]`} {
		if sum(body, "payment.amount") != sum(body) {
			t.Errorf("%s: no selected member, yet not fingerprinted whole", body)
		}
	}
	if sum(`{"payment":{"x":1}}`, "payment.amount") == sum(`{"payment":{"x":2}}`, "payment.amount") {
		t.Error("bodies without the selected member share a fingerprint")
	}
	// The number guard applies to selected nested values only.
	if sum(`{"a":{"b":1,"c":12345678901234567890}}`, "a.b") != sum(`{"a":{"c":12345678901234567891,"b":1}}`, "a.b") {
		t.Error("guard fired on an unselected nested member")
	}
	if sum(`{"a":{"b":12345678901234567890}}`, "a.b") == sum(`{"a":{"b":12345678901234567891}}`, "a.b") {
		t.Error("guard did not fire on a selected nested member")
	}
	// Duplicates anywhere are still an error.
	for _, body := range []string{`{"a":{"b":1,"b":2}}`, `{"a":{"b":1},"x":{"y":1,"y":1}}`, `{"a":1,"a":2}`} {
		if _, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: []byte(body), Fields: []string{"a.b"}}); !errors.Is(err, ErrDuplicateKey) {
			t.Errorf("%s: error %v, want ErrDuplicateKey", body, err)
		}
	}
}

func TestFieldEscapes(t *testing.T) {
	t.Parallel()
	h := New(nil)
	sum := func(body string, fields ...string) string {
		return mustSum(t, h, "POST", "/", jsonType, body, fields...)
	}
	// a~1b is the member "a.b"; a.b the member b of a.
	if sum(`{"a.b":1,"a":{"b":2}}`, "a~1b") == sum(`{"a.b":3,"a":{"b":2}}`, "a~1b") {
		t.Error("a~1b does not select the member a.b")
	}
	if sum(`{"a.b":1,"a":{"b":2}}`, "a.b") != sum(`{"a.b":3,"a":{"b":2}}`, "a.b") {
		t.Error("a.b selects the member a.b")
	}
	if sum(`{"a~b":1,"x":0}`, "a~0b") == sum(`{"a~b":2,"x":0}`, "a~0b") {
		t.Error("a~0b does not select the member a~b")
	}
	// ~01 is '~' then '1', not '.'.
	if sum(`{"~1":1,".":0,"x":0}`, "~01") == sum(`{"~1":2,".":0,"x":0}`, "~01") {
		t.Error("~01 does not select the member ~1")
	}
	// Names are compared decoded: "\u002e" is '.', "\u0061" is 'a'.
	if sum(`{"a\u002eb":1,"x":0}`, "a~1b") == sum(`{"a\u002eb":2,"x":0}`, "a~1b") {
		t.Error("an escaped member name was not matched")
	}
	if sum(`{"\u0070":{"\u00e9":1}}`, "p.é") == sum(`{"p":{"é":2}}`, "p.é") {
		t.Error("escaped nested names were not matched")
	}
	// Empty names are names.
	if sum(`{"":{"":1},"x":0}`, ".") == sum(`{"":{"":2},"x":0}`, ".") {
		t.Error(`"." does not select member "" of member ""`)
	}
	// Invalid fields select nothing.
	for _, f := range []string{"a~", "a~2", "~", "a.~x", "\xff", "a.\xff"} {
		if err := ValidateFields([]string{"ok", f}); err == nil {
			t.Errorf("ValidateFields accepts %q", f)
		}
		body := `{"a~":1,"a~2":1,"~":1,"a":{"~x":1,"\ufffd":1},"\ufffd":1}`
		if sum(body, f) != sum(body) {
			t.Errorf("invalid field %q selected a member", f)
		}
	}
	if err := ValidateFields([]string{"", ".", "a.b", "a~0~1", "é.😂"}); err != nil {
		t.Errorf("ValidateFields: %v", err)
	}
	// Forms: a field is a key, byte for byte.
	form := func(body string, fields ...string) string {
		return mustSum(t, h, "POST", "/", formType, body, fields...)
	}
	if form("payment.amount=5&x=1", "payment.amount") == form("payment.amount=6&x=1", "payment.amount") {
		t.Error("a form key with a dot is not selected")
	}
	if form("payment.amount=5&x=1", "payment.amount") != form("payment.amount=5&x=2", "payment.amount") {
		t.Error("an unselected form key changed the fingerprint")
	}
	if form("a~1b=5&x=1", "a~1b") == form("a~1b=6&x=1", "a~1b") {
		t.Error("a form key with a tilde is not selected byte for byte")
	}
}

// TestLongFieldPath: a path of many segments costs its length, nothing more.
func TestLongFieldPath(t *testing.T) {
	t.Parallel()
	h := New(nil)
	body := strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth)
	path := strings.TrimSuffix(strings.Repeat("a.", MaxDepth), ".")
	one := mustSum(t, h, "POST", "/", jsonType, body, path)
	two := mustSum(t, h, "POST", "/", jsonType, strings.Replace(body, "1", "2", 1), path)
	if one == two {
		t.Error("the deepest member was not selected")
	}
	mustSum(t, h, "POST", "/", jsonType, body, path+".a.a")
}

// refFields is the reference selection, built on encoding/json: the
// description of what each field's path reaches, or of the whole document
// when no path is found. ok is false when the reference cannot judge the
// body (not an object encoding/json decodes, or numbers the guard keeps raw).
func refFields(body []byte, fields []string) (string, bool) {
	if _, guarded, err := canonical(nopFataler{}, body); err != nil || guarded {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return "", false
	}
	canon := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		out, err := jcs.Transform(b)
		if err != nil {
			panic(err)
		}
		return string(out)
	}
	root, isObject := doc.(map[string]any)
	var out strings.Builder
	found := false
	for _, f := range fields {
		fmt.Fprintf(&out, "%q:", f)
		if ValidateFields([]string{f}) != nil {
			out.WriteString("missing@0;")
			continue
		}
		var cur any = root
		for level, seg := range strings.Split(f, ".") {
			seg = strings.NewReplacer("~1", ".", "~0", "~").Replace(seg)
			obj, ok := cur.(map[string]any)
			if !ok {
				fmt.Fprintf(&out, "notobject@%d=%s;", level, canon(cur))
				break
			}
			v, ok := obj[seg]
			if !ok {
				fmt.Fprintf(&out, "missing@%d;", level)
				break
			}
			cur = v
			if level == strings.Count(f, ".") {
				fmt.Fprintf(&out, "found=%s;", canon(v))
				found = true
			}
		}
	}
	if !isObject || !found {
		return "whole=" + canon(doc), true
	}
	return out.String(), true
}

type nopFataler struct{}

func (nopFataler) Helper()               {}
func (nopFataler) Fatalf(string, ...any) {}

// checkFields: two bodies share a fingerprint under fields exactly when the
// reference selection of both is equal.
func checkFields(t fataler, h *Hasher, a, b []byte, fields []string) {
	t.Helper()
	ra, okA := refFields(a, fields)
	rb, okB := refFields(b, fields)
	if !okA || !okB {
		return
	}
	sa, errA := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: a, Fields: fields})
	sb, errB := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: b, Fields: fields})
	if errA != nil || errB != nil {
		if !errors.Is(errA, ErrDuplicateKey) && !errors.Is(errB, ErrDuplicateKey) {
			t.Fatalf("%s / %s: %v %v", a, b, errA, errB)
		}
		return // encoding/json keeps the last of repeated names
	}
	if (sa == sb) != (ra == rb) {
		t.Fatalf("fields %q:\n%s\n%s\nequal selections %v (%s | %s), equal fingerprints %v", fields, a, b, ra == rb, ra, rb, sa == sb)
	}
}

// fieldPath draws a path of one to three names, escaped.
func fieldPath(t *rapid.T) string {
	segs := rapid.SliceOfN(rapid.SampledFrom([]string{"", "a", "b", "a.b", "~", "é", "\\", "aa"}), 1, 3).Draw(t, "path")
	for i, s := range segs {
		segs[i] = strings.NewReplacer("~", "~0", ".", "~1").Replace(s)
	}
	return strings.Join(segs, ".")
}

// TestFieldsMeaningDecides: over generated documents and their mutations,
// fingerprints under nested fields agree exactly with the reference.
func TestFieldsMeaningDecides(t *testing.T) {
	t.Parallel()
	h := New(nil)
	names := rapid.SampledFrom([]string{"", "a", "b", "a.b", "~", "é", "\\", "aa"})
	rapid.Check(t, func(t *rapid.T) {
		v := genFieldsValue(t, names, 0)
		fields := rapid.SliceOfN(rapid.Custom(fieldPath), 1, 3).Draw(t, "fields")
		// Paths that exist in v, and one step beyond them, so that found,
		// missing and blocked paths are all common.
		for range rapid.IntRange(1, 2).Draw(t, "existing") {
			fields = append(fields, existingPath(t, v))
		}
		fields = rapid.Permutation(fields).Draw(t, "order")
		var a strings.Builder
		spell(t, &a, v)
		// Several mutations per document: near-equal pairs are where a
		// selection would merge two requests.
		for range 10 {
			w := mutate(t, v)
			if rapid.Bool().Draw(t, "mutate-all") {
				w = v
				w.elems = append([]value(nil), v.elems...)
				for i := range w.elems {
					w.elems[i] = mutate(t, w.elems[i])
				}
			}
			var b strings.Builder
			spell(t, &b, w)
			checkFields(t, h, []byte(a.String()), []byte(b.String()), fields)
		}
		// Another spelling of the same document selects the same.
		var c strings.Builder
		spell(t, &c, v)
		if sa, sc := mustSumInput(t, h, Input{ContentType: jsonType, Body: []byte(a.String()), Fields: fields}),
			mustSumInput(t, h, Input{ContentType: jsonType, Body: []byte(c.String()), Fields: fields}); sa != sc {
			t.Fatalf("two spellings differ under %q:\n%s\n%s", fields, a.String(), c.String())
		}
	})
}

// genFieldsValue draws an object whose names are those paths use, nested,
// so that paths are often found, missing or blocked.
func genFieldsValue(t *rapid.T, names *rapid.Generator[string], depth int) value {
	if depth > 0 && (depth >= 3 || rapid.IntRange(0, 2).Draw(t, "leaf") == 0) {
		return genValue(t, 2)
	}
	v := value{kind: 6, keys: rapid.SliceOfNDistinct(names, 0, 4, rapid.ID[string]).Draw(t, "keys")}
	for range v.keys {
		v.elems = append(v.elems, genFieldsValue(t, names, depth+1))
	}
	return v
}

// FuzzFields checks nested field selection against the reference on pairs
// of bodies, and that Sum never fails other than as documented.
func FuzzFields(f *testing.F) {
	seeds := [][3]string{
		{`{"payment":{"amount":1},"id":1}`, `{"payment":{"amount":2},"id":1}`, "payment.amount"},
		{`{"payment":null,"id":1}`, `{"id":1}`, "payment.amount"},
		{`{"payment":"x","id":1}`, `{"payment":"y","id":1}`, "payment.amount"},
		{`{"a.b":1,"a":{"b":1}}`, `{"a.b":2,"a":{"b":1}}`, "a~1b"},
		{`{"a~b":[1]}`, `{"a~b":[2]}`, "a~0b"},
		{`{"":{"":1}}`, `{"":{"":2}}`, "."},
		{`{"a":{"b":{}}}`, `{"a":{}}`, "a.b.c"},
		{`{"\u0061":{"b":1}}`, `{"a":{"b":1.0}}`, "a.b"},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]), s[2])
	}
	h := New(nil)
	f.Fuzz(func(t *testing.T, a, b []byte, field string) {
		for _, fields := range [][]string{{field}, {"id", field}} {
			for _, body := range [][]byte{a, b} {
				_, err := h.Sum(Input{ContentType: jsonType, Body: body, Fields: fields})
				if err != nil && !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrDuplicateKey) {
					t.Fatalf("undocumented error %v", err)
				}
			}
			checkFields(t, h, a, b, fields)
		}
	})
}

// existingPath walks v through randomly chosen members, sometimes one name
// further, and returns the escaped path.
func existingPath(t *rapid.T, v value) string {
	var segs []string
	for v.kind == 6 && len(v.keys) > 0 {
		i := rapid.IntRange(0, len(v.keys)-1).Draw(t, "member")
		segs = append(segs, strings.NewReplacer("~", "~0", ".", "~1").Replace(v.keys[i]))
		v = v.elems[i]
		if len(segs) > 1 && rapid.IntRange(0, 2).Draw(t, "stop") == 0 {
			break
		}
	}
	if len(segs) == 0 || rapid.Bool().Draw(t, "beyond") {
		segs = append(segs, rapid.SampledFrom([]string{"a", "b", ""}).Draw(t, "beyond-name"))
	}
	return strings.Join(segs, ".")
}
