package fingerprint

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/gowebpki/jcs"
)

const jsonType = "application/json"
const formType = "application/x-www-form-urlencoded"

// TestSumLayout pins the hash input: changing it silently would make every
// stored fingerprint mismatch its retries after an upgrade.
func TestSumLayout(t *testing.T) {
	t.Parallel()
	// Canonical target: the path, then each pair as flag, key, value.
	target := "\x0b/v1/charges" + "\x00\x01a\x011" + "\x00\x01b\x012"
	input := "idem fingerprint v2\n" + "\x04POST" + "\x0b/v1/charges" + "\x16" + target + "\x01" + "hello"
	in := Input{Method: "POST", Route: "/v1/charges", Target: "/v1/charges?b=2&a=%31", ContentType: "text/plain", Body: []byte("hello")}
	plain := sha256.Sum256([]byte(input))
	if got := mustSumInput(t, New(nil), in); got != hex.EncodeToString(plain[:]) {
		t.Fatalf("plain fingerprint %s, want %x", got, plain)
	}
	mac := hmac.New(sha256.New, []byte("secret"))
	mac.Write([]byte(input))
	if got := mustSumInput(t, New([]byte("secret")), in); got != hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("keyed fingerprint %s, want %x", got, mac.Sum(nil))
	}
	jsonInput := "idem fingerprint v2\n" + "\x04POST" + "\x01/" + "\x02\x01/" + "\x02" + `{"a":1,"b":2}`
	want := sha256.Sum256([]byte(jsonInput))
	if got := mustSumInput(t, New(nil), Input{Method: "POST", Route: "/", Target: "/?", ContentType: jsonType, Body: []byte(`{ "b": 2, "a": 1 }`)}); got != hex.EncodeToString(want[:]) {
		t.Fatalf("json fingerprint %s, want %x", got, want)
	}
	// Fields: each field's text, then how its path ends (1 found and the
	// value, 0 missing and the level, 2 not an object, the level and the
	// value). An empty target is an empty path.
	fieldsInput := "idem fingerprint v2\n" + "\x04POST" + "\x01/" + "\x01\x00" + "\x03" +
		"\x03a.b\x01" + "1" + "\x01x\x00\x00" + "\x05c.d.e\x02\x01" + "[2]"
	want = sha256.Sum256([]byte(fieldsInput))
	in = Input{Method: "POST", Route: "/", ContentType: jsonType, Body: []byte(`{"c":[2.0],"a":{"b":1}}`), Fields: []string{"a.b", "x", "c.d.e"}}
	if got := mustSumInput(t, New(nil), in); got != hex.EncodeToString(want[:]) {
		t.Fatalf("json fields fingerprint %s, want %x", got, want)
	}
}

// TestVersions: a request fingerprinted under layout version 1 (method,
// route, kind, body; no target) never matches its version 2 fingerprint, so
// a retry of a record stored by an older release is refused (422), never
// executed again.
func TestVersions(t *testing.T) {
	t.Parallel()
	v1 := func(method, route string, kind byte, body string) string {
		in := "idem fingerprint v1\n" + string(rune(len(method))) + method + string(rune(len(route))) + route + string(kind) + body
		sum := sha256.Sum256([]byte(in))
		return hex.EncodeToString(sum[:])
	}
	h := New(nil)
	for _, c := range []struct {
		in   Input
		kind byte
		body string // canonical body
	}{
		{Input{Method: "POST", Route: "/v1/charges", Target: "/v1/charges", ContentType: "text/plain", Body: []byte("hello")}, kindRaw, "hello"},
		{Input{Method: "POST", Route: "/v1/charges", ContentType: "text/plain", Body: []byte("hello")}, kindRaw, "hello"},
		{Input{Method: "POST", Route: "/", Target: "/", ContentType: jsonType, Body: []byte(`{"b":2,"a":1}`)}, kindJSON, `{"a":1,"b":2}`},
	} {
		if got, old := mustSumInput(t, h, c.in), v1(c.in.Method, c.in.Route, c.kind, c.body); got == old {
			t.Errorf("%+v: version 2 fingerprint equals version 1", c.in)
		}
	}
	// The version 1 helper above is right: it reproduces a fingerprint
	// recorded by that release.
	if got := v1("POST", "/v1/charges", kindRaw, "hello"); got != "d9f4fbe160b20f2f33714bac348aa44b07bda6ca3f7b309a87ee39a868135977" {
		t.Fatalf("version 1 layout reproduced as %s", got)
	}
}

func TestSecret(t *testing.T) {
	t.Parallel()
	secret := []byte("s1")
	h1 := New(secret)
	secret[0] = 'x' // New must copy the secret
	sums := map[string]string{
		"nil":   mustSum(t, New(nil), "POST", "/", jsonType, `{}`),
		"empty": mustSum(t, New([]byte{}), "POST", "/", jsonType, `{}`),
		"s1":    mustSum(t, h1, "POST", "/", jsonType, `{}`),
		"s1bis": mustSum(t, New([]byte("s1")), "POST", "/", jsonType, `{}`),
		"s2":    mustSum(t, New([]byte("s2")), "POST", "/", jsonType, `{}`),
	}
	if sums["nil"] != sums["empty"] || sums["s1"] != sums["s1bis"] {
		t.Fatalf("equal secrets give different fingerprints: %v", sums)
	}
	if sums["nil"] == sums["s1"] || sums["s1"] == sums["s2"] {
		t.Fatalf("different secrets give one fingerprint: %v", sums)
	}
	if len(sums["s1"]) != 64 || strings.ToLower(sums["s1"]) != sums["s1"] {
		t.Fatalf("not lowercase hex SHA-256: %q", sums["s1"])
	}
}

// TestDomainSeparation checks that no two different (method, route, kind,
// body) inputs share a fingerprint through concatenation or kind confusion.
func TestDomainSeparation(t *testing.T) {
	t.Parallel()
	h := New(nil)
	type in struct{ method, route, ct, body string }
	inputs := []in{
		{"POST", "/ab", "", ""},
		{"POST/", "ab", "", ""},
		{"POST", "/a", "", "b"},
		{"POS", "T/ab", "", ""},
		{"POST", "", "", "/ab"},
		{"", "POST/ab", "", ""},
		{"post", "/ab", "", ""},
		{"POST", "/ab", jsonType, `{}`},
		{"POST", "/ab", "", `{}`},
		{"POST", "/ab", formType, ""},
		{"POST", "/ab", formType, "a=1"},
		{"POST", "/ab", "", "a=1"},
		{"POST", "/ab", jsonType, `"a=1"`},
		{"POST", "/ab", jsonType, `1e400`},
		{"POST", "/ab", "", `1e400`},
		{"POST", "/ab", jsonType, `{"a":1}`},
	}
	seen := map[string]in{}
	for _, i := range inputs {
		sum := mustSum(t, h, i.method, i.route, i.ct, i.body)
		if prev, ok := seen[sum]; ok {
			t.Fatalf("%+v and %+v share fingerprint %s", prev, i, sum)
		}
		seen[sum] = i
	}
	// A body left in a content coding is its own kind, the coding names
	// length-prefixed: it equals neither the raw bytes, nor the same bytes
	// in another coding, nor codings whose names run into the body.
	encoded := map[string]Input{}
	for _, in := range []Input{
		{Method: "POST", Route: "/ab", ContentType: jsonType, ContentEncoding: "br", Body: []byte("xyz")},
		{Method: "POST", Route: "/ab", ContentType: jsonType, ContentEncoding: "zstd", Body: []byte("xyz")},
		{Method: "POST", Route: "/ab", ContentType: jsonType, ContentEncoding: "brx", Body: []byte("yz")},
		{Method: "POST", Route: "/ab", Body: []byte("xyz")},
		{Method: "POST", Route: "/ab", Body: []byte("\x02brxyz")},
	} {
		sum := mustSumInput(t, h, in)
		if prev, ok := encoded[sum]; ok {
			t.Fatalf("%+v and %+v share fingerprint %s", prev, in, sum)
		}
		encoded[sum] = in
	}
	// Selected fields are their own kind: {"a":1} whole differs from
	// fields [a] of the same document.
	whole := mustSum(t, h, "POST", "/ab", jsonType, `{"a":1}`)
	if sel := mustSum(t, h, "POST", "/ab", jsonType, `{"a":1}`, "a"); sel == whole {
		t.Fatal("fields mode equals whole-document mode")
	}
}

func TestMediaKind(t *testing.T) {
	t.Parallel()
	tests := map[string]byte{
		"":                                  kindRaw,
		"application/json":                  kindJSON,
		"Application/JSON; charset=UTF-8":   kindJSON,
		" application/json ;charset=utf-8":  kindJSON,
		"application/problem+json":          kindJSON,
		"application/vnd.api+JSON":          kindJSON,
		"application/merge-patch+json; x=1": kindJSON,
		"application/+json":                 kindRaw,
		"+json":                             kindRaw,
		"text/json":                         kindRaw,
		"application/jsonx":                 kindRaw,
		"application/json-seq":              kindRaw,
		"application/x-www-form-urlencoded": kindForm,
		"application/x-www-form-urlencoded; charset=utf-8": kindForm,
		"multipart/form-data; boundary=x":                  kindRaw,
		"text/plain":                                       kindRaw,
		"application/octet-stream":                         kindRaw,
	}
	for ct, want := range tests {
		if got := mediaKind(ct); got != want {
			t.Errorf("mediaKind(%q) = %d, want %d", ct, got, want)
		}
	}
}

func TestRaw(t *testing.T) {
	t.Parallel()
	h := New(nil)
	a := mustSum(t, h, "POST", "/", "multipart/form-data; boundary=x", "--x\r\n")
	if b := mustSum(t, h, "POST", "/", "text/plain", "--x\r\n"); a != b {
		t.Fatal("raw bodies with different non-canonical types differ")
	}
	if b := mustSum(t, h, "POST", "/", "", "--x\r\n", "a"); a != b {
		t.Fatal("fields changed a raw fingerprint")
	}
	if b := mustSum(t, h, "POST", "/", "", "--x\n"); a == b {
		t.Fatal("different raw bodies share a fingerprint")
	}
	// Invalid JSON or UTF-8 is fine when it is not declared JSON.
	mustSum(t, h, "POST", "/", "text/plain", "{\xff")
}

func TestJSONCanonical(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{`null`, `null`},
		{` true `, `true`},
		{"\t\r\n false\n", `false`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`[ 1 , 2 ,[ ] , { } ]`, `[1,2,[],{}]`},
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{`{"a":{"d":1,"c":[{"f":1,"e":2}]},"":0}`, `{"":0,"a":{"c":[{"e":2,"f":1}],"d":1}}`},
		// Numbers that keep their value.
		{`[1.50, 1.5e0, 15E-1, 0.15e+1]`, `[1.5,1.5,1.5,1.5]`},
		{`[1e2, 1E+2, 100.0, 1e02]`, `[100,100,100,100]`},
		{`[0, 0.0, 0e5, 0e99999999, 0.000e-3]`, `[0,0,0,0,0]`},
		{`[1e21, 1e20, 1e-6, 1e-7, 1e30, 1.5e300]`, `[1e+21,100000000000000000000,0.000001,1e-7,1e+30,1.5e+300]`},
		{`[-1.5, -1e-7, 5e-324, 1.7976931348623157e308, 9007199254740992]`, `[-1.5,-1e-7,5e-324,1.7976931348623157e+308,9007199254740992]`},
		{`[0.1, 0.000001, 0.0000015, 123456789012345]`, `[0.1,0.000001,0.0000015,123456789012345]`},
		// Strings: JCS escaping.
		{`"\u0041\/\"\\\b\f\n\r\t\u0001\u001f\u007f"`, `"A/\"\\\b\f\n\r\t\u0001\u001f` + "\x7f" + `"`},
		{`"\u00e9\u20ac\ud83d\ude02"`, `"é€😂"`},
		{`"é€😂 </script>"`, `"é€😂 </script>"`},
		{`"\u2028\u2029"`, "\"\u2028\u2029\""},
		{`"\u0000"`, `"\u0000"`},
		// RFC 8785 §3.2.3: UTF-16 code unit order, where U+1F602 (units D83D
		// DE02) sorts before U+FB33 although its code point is larger.
		{`{"\ufb33":1,"\ud83d\ude02":2,"\u20ac":3,"\r":4,"1":5,"\u0080":6,"\u00f6":7,"</script>":8,"\n":9}`,
			"{\"\\n\":9,\"\\r\":4,\"1\":5,\"</script>\":8,\"\u0080\":6,\"\u00f6\":7,\"\u20ac\":3,\"\U0001F602\":2,\"\ufb33\":1}"},
		{`{"a":1,"aa":2,"A":3,"":4,"b":5}`, `{"":4,"A":3,"a":1,"aa":2,"b":5}`},
		// The same names unescaped, and mixed with escaped ones.
		{"{\"\ufb33\":1,\"\U0001F602\":2,\"\u20ac\":3,\"\uE000\":4,\"\uFFFF\":5,\"\U0010FFFF\":6,\"\u00e9\":7}",
			"{\"\u00e9\":7,\"\u20ac\":3,\"\U0001F602\":2,\"\U0010FFFF\":6,\"\uE000\":4,\"\ufb33\":1,\"\uFFFF\":5}"},
		{"{\"\ufb33a\":1,\"\ufb33\U0001F602\":2,\"\ufb33\\ud83d\\ude01\":3,\"\ufb33\ufb33\":4}",
			"{\"\ufb33a\":1,\"\ufb33\U0001F601\":3,\"\ufb33\U0001F602\":2,\"\ufb33\ufb33\":4}"},
		// The first and last surrogate pairs; U+10000 (units D800 DC00) sorts
		// before U+E000.
		{`"\ud800\udc00\udbff\udfff"`, "\"\U00010000\U0010FFFF\""},
		{`{"\ue000":1,"\ud800\udc00":2}`, "{\"\U00010000\":2,\"\ue000\":1}"},
		// Unicode is not normalised: NFC and NFD spellings stay distinct.
		{`{"A\u030a":1,"\u00c5":2}`, "{\"A\u030a\":1,\"\u00c5\":2}"},
	}
	for _, tt := range tests {
		got, guarded, err := canonical(t, []byte(tt.in))
		if err != nil || guarded {
			t.Errorf("canonical(%s): guarded=%v err=%v", tt.in, guarded, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("canonical(%s)\n got %s\nwant %s", tt.in, got, tt.want)
		}
		ref, err := jcs.Transform([]byte(tt.in))
		if err != nil || string(ref) != tt.want {
			t.Errorf("jcs.Transform(%s) = %s, %v; the table disagrees with the reference", tt.in, ref, err)
		}
	}
}

// The examples of RFC 8785 and of the jcs test suite.
func TestJSONReferenceDocuments(t *testing.T) {
	t.Parallel()
	docs := []string{
		"[\n  56,\n  {\n    \"d\": true,\n    \"10\": null,\n    \"1\": [ ]\n  }\n]",
		`{"peach": "This sorting order", "péché": "is wrong according to French", "pêche": "but canonicalization MUST", "sin":   "ignore locale"}`,
		`{"1": {"f": {"f": "hi","F": 5} ,"\n": 56.0}, "10": { }, "": "empty", "a": { }, "111": [ {"e": "yes","E": "no" } ], "A": { }}`,
		`{"Unnormalized Unicode":"A\u030a"}`,
		`{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\u000a": "Newline", "1": "One", "\u0080": "Control\u007f", "\ud83d\ude02": "Smiley", "\u00f6": "Latin Small Letter O With Diaeresis", "\ufb33": "Hebrew Letter Dalet With Dagesh", "</script>": "Browser Challenge"}`,
		`    "this is a test string 1235"`,
	}
	for _, d := range docs {
		got, guarded, err := canonical(t, []byte(d))
		want, jerr := jcs.Transform([]byte(d))
		if err != nil || jerr != nil || guarded || string(got) != string(want) {
			t.Errorf("%s:\n got %s (guarded=%v, %v)\nwant %s (%v)", d, got, guarded, err, want, jerr)
		}
	}
	// RFC 8785's own number example includes 333333333.33333329, which a
	// double rounds to 333333333.3333333: guarded, so hashed raw.
	values := `{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001]}`
	if _, guarded, err := canonical(t, []byte(values)); err != nil || !guarded {
		t.Errorf("RFC 8785 values example: guarded=%v err=%v, want guarded", guarded, err)
	}
	if got, guarded, _ := canonical(t, []byte(`[1E30, 4.50, 2e-3, 0.000000000000000000000000001]`)); guarded || string(got) != `[1e+30,4.5,0.002,1e-27]` {
		t.Errorf("exact numbers: %s guarded=%v", got, guarded)
	}
}

func TestJSONInvalid(t *testing.T) {
	t.Parallel()
	tests := []string{
		``, ` `, `{`, `[`, `]`, `}`, `[1,]`, `[,1]`, `{"a":1,}`, `{,}`, `{"a"}`, `{"a":}`, `{a:1}`, `{'a':1}`,
		`{"a" 1}`, `{"a":1 "b":2}`, `[1 2]`, `1 2`, `{}{}`, `[]]`, `"a"x`, `nul`, `tru`, `truex`, `True`, `NULL`,
		`01`, `-01`, `00`, `+1`, `.5`, `1.`, `-`, `-.5`, `1e`, `1e+`, `1E-`, `0x10`, `1_000`, `Infinity`, `-Infinity`, `NaN`,
		`1.e5`, `--1`, `1ee5`, `"abc`, `"\x"`, `"\u12"`, `"\u12G4"`, `"\U0041"`, `"\'"`, "\"\t\"", "\"\n\"", "\"\x00\"", "\"\x1f\"",
		"\"\xff\"", "\"\x80\"", "\"\xc3\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\xef\xbb\xbf{}", "{\"\xff\":1}",
		`"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800x"`, `"\ud800\\"`, `"\udbff\udbff"`, `"\ud83d"`, `"\ude02\ud83d"`,
		"[1]\x00", "\x00", "\u00a0[]", "[1,\u00a02]", "/* */ {}", "{} // c",
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
		strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1),
		strings.Repeat("[", 1<<20),
	}
	h := New(nil)
	for _, in := range tests {
		_, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: []byte(in)})
		if !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("Sum(%.40q) error = %v, want ErrInvalidJSON", in, err)
		}
		if _, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: []byte(in), Fields: []string{"a"}}); !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("Sum(%.40q, fields) error = %v, want ErrInvalidJSON", in, err)
		}
	}
	deep := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	mustSum(t, h, "POST", "/", jsonType, deep)
	deepObj := strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth)
	mustSum(t, h, "POST", "/", jsonType, deepObj)
}

func TestDuplicateKey(t *testing.T) {
	t.Parallel()
	h := New(nil)
	for _, in := range []string{
		`{"a":1,"a":2}`,
		`{"a":1,"a":1}`,
		`{"a":1,"\u0061":2}`,
		`{"\u00e9":1,"é":2}`,
		`{"\ud83d\ude02":1,"😂":2}`,
		`{"a\/b":1,"a/b":2}`,
		`[{"x":{"b":1,"c":2,"b":3}}]`,
		`{"z":0,"a":1,"m":2,"a":3}`,
	} {
		for _, fields := range [][]string{nil, {"a"}, {"nope"}} {
			if _, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: []byte(in), Fields: fields}); !errors.Is(err, ErrDuplicateKey) {
				t.Errorf("Sum(%s, %q) error = %v, want ErrDuplicateKey", in, fields, err)
			}
		}
	}
	// Names that only look alike are not duplicates.
	for _, in := range []string{`{"a":1,"A":2}`, `{"A\u030a":1,"\u00c5":2}`, `{"a":1,"a ":2}`, `{"":1,"\u0000":2}`} {
		mustSum(t, h, "POST", "/", jsonType, in)
	}
}

// TestNumberGuards covers the leniencies of RFC 8785 number formatting: each
// pair is two different requests that the float64 round trip would merge.
func TestNumberGuards(t *testing.T) {
	t.Parallel()
	h := New(nil)
	pairs := [][2]string{
		{`12345678901234567890`, `12345678901234567891`},
		{`9007199254740993`, `9007199254740992`},
		{`0.1000000000000000055511151231257827`, `0.1`},
		{`333333333.33333329`, `333333333.3333333`},
		{`1e-400`, `0`},
		{`-1e-400`, `0`},
		{`1e-400`, `-1e-400`},
		{`-0`, `0`},
		{`-0.0`, `0`},
		{`-0e10`, `0`},
		{`4e-324`, `5e-324`},
		{`1e400`, `1e401`},
		{`1e99999999`, `1e99999998`},
		{`-1e99999999`, `1e99999999`},
		{`1` + strings.Repeat("0", 400), `1e400`},
		{`1152921504606846976`, `1152921504606847000`}, // 2^60 is a double, but formats as the latter
	}
	for _, p := range pairs {
		for _, wrap := range []string{`%s`, `[%s]`, `{"amount":%s}`, `{"b":[1,{"c":%s}],"a":0}`} {
			a, b := fmt.Sprintf(wrap, p[0]), fmt.Sprintf(wrap, p[1])
			if mustSum(t, h, "POST", "/", jsonType, a) == mustSum(t, h, "POST", "/", jsonType, b) {
				t.Errorf("%s and %s share a fingerprint", a, b)
			}
		}
		if _, guarded, err := canonical(t, []byte(p[0])); err != nil || !guarded {
			t.Errorf("%s: guarded=%v err=%v, want guarded", p[0], guarded, err)
		}
	}
	// A guarded document is hashed as raw bytes, so its whitespace counts:
	// two spellings are two requests (the safe direction).
	if mustSum(t, h, "POST", "/", jsonType, `{"a":12345678901234567890}`) == mustSum(t, h, "POST", "/", jsonType, `{ "a": 12345678901234567890 }`) {
		t.Error("guarded spellings share a fingerprint")
	}
	// Exact values survive however they are spelled, long ones included.
	same := [][]string{
		{`1`, `1.0`, `1.` + strings.Repeat("0", 5000), `10e-1`, `0.` + strings.Repeat("0", 3000) + `1e3001`},
		{`100000000000000000000`, `100000000000000000000.0`, `1e20`, `1E+20`},
		{`1e300`, `1` + strings.Repeat("0", 300)},
		{`[0.5]`, `[5e-1]`, `[0.50]`},
	}
	for _, group := range same {
		want := mustSum(t, h, "POST", "/", jsonType, group[0])
		for _, in := range group[1:] {
			if got := mustSum(t, h, "POST", "/", jsonType, in); got != want {
				t.Errorf("%.40s and %.40s differ", group[0], in)
			}
		}
	}
}

// Not parallel: it reads the process's allocation counter, which parallel
// tests would inflate.
func TestHugeExponentIsCheap(t *testing.T) {
	h := New(nil)
	for _, in := range []string{`1e99999999`, `[1e-99999999999999999999999999999]`, `{"a":0.0e99999999}`, `1` + strings.Repeat("0", 1<<16)} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if _, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: []byte(in)}); err != nil {
			t.Fatalf("%.20s: %v", in, err)
		}
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
			t.Errorf("%.20s allocated %d bytes", in, d)
		}
	}
}

func TestFieldsJSON(t *testing.T) {
	t.Parallel()
	h := New(nil)
	sum := func(body string, fields ...string) string {
		return mustSum(t, h, "POST", "/", jsonType, body, fields...)
	}
	base := sum(`{"amount":100,"currency":"usd","nonce":"x1"}`, "amount", "currency")
	if got := sum(`{"nonce":"x2","currency":"usd","amount":100.0}`, "amount", "currency"); got != base {
		t.Error("unselected member changed the fingerprint")
	}
	if got := sum(`{"amount":101,"currency":"usd","nonce":"x1"}`, "amount", "currency"); got == base {
		t.Error("selected member change kept the fingerprint")
	}
	if sum(`{"a":null}`, "a") == sum(`{}`, "a") {
		t.Error("missing member equals null")
	}
	if sum(`{"a":1}`, "a", "b") == sum(`{"b":1}`, "a", "b") {
		t.Error("a value moved between fields kept the fingerprint")
	}
	if sum(`{"a":"b"}`, "a") == sum(`{"ab":""}`, "ab") {
		t.Error("field name concatenation collides")
	}
	if sum(`{"\u00e9":1}`, "é") == sum(`{}`, "é") {
		t.Error("escaped member name not matched")
	}
	// No member matches a field name that is not UTF-8: the body has no
	// selected member and is fingerprinted whole.
	if sum(`{"\ufffd":1}`, "\xff") != sum(`{"\ufffd":1}`) {
		t.Error("a field name that is not UTF-8 matched a member")
	}
	// Bodies with none of the selected members do not all look alike.
	if sum(`{"x":1}`, "a") == sum(`{"x":2}`, "a") {
		t.Error("bodies without any selected member share a fingerprint")
	}
	// Selection of a non-object document fingerprints the whole of it.
	if sum(`[1]`, "a") != sum(`[1]`) {
		t.Error("non-object document with fields differs from whole document")
	}
	// Only selected numbers are guarded.
	if sum(`{"a":1,"b":12345678901234567890}`, "a") != sum(`{ "b":12345678901234567891, "a":1 }`, "a") {
		t.Error("guard fired on an unselected member")
	}
	if sum(`{"a":12345678901234567890}`, "a") == sum(`{"a":12345678901234567891}`, "a") {
		t.Error("guard did not fire on a selected member")
	}
	// The order of fields is part of the route's configuration.
	if sum(`{"a":1,"b":2}`, "a", "b") == sum(`{"a":1,"b":2}`, "b", "a") {
		t.Log("field order is not significant")
	}
}

func TestForm(t *testing.T) {
	t.Parallel()
	h := New(nil)
	sum := func(body string, fields ...string) string {
		return mustSum(t, h, "POST", "/", formType, body, fields...)
	}
	equal := [][]string{
		{"a=1&b=2", "b=2&a=1", "a=%31&b=2", "%61=1&b=2", "&a=1&&b=2&", "b=2&a=1&"},
		{"a=x+y", "a=x%20y", "a=x%20y&"},
		{"a=", "a"},
		{"", "&", "&&"},
		{"a=1&a=2&b=3", "a=1&b=3&a=2", "b=3&a=1&a=2"},
		{"k=%E2%82%AC", "k=%e2%82%ac", "k=€"},
	}
	for _, group := range equal {
		want := sum(group[0])
		for _, in := range group[1:] {
			if got := sum(in); got != want {
				t.Errorf("%q and %q differ", group[0], in)
			}
		}
	}
	different := [][2]string{
		{"a=1&a=2", "a=2&a=1"},
		{"a=1", "a=2"},
		{"a=1&b=2", "a=1&b=2&c="},
		{"a=1", "a=1&a=1"},
		{"ab=c", "a=bc"},
		{"a=b%3Dc", "a%3Db=c"},
		{"a=b%26c=d", "a=b&c=d"},
		{"a=%2B", "a=+"},
		{"=a", "a="},
		{"a=b=c", "a=b%3Dc&"}, // equal: only the first '=' splits
	}
	for _, p := range different[:len(different)-1] {
		if sum(p[0]) == sum(p[1]) {
			t.Errorf("%q and %q share a fingerprint", p[0], p[1])
		}
	}
	if last := different[len(different)-1]; sum(last[0]) != sum(last[1]) {
		t.Errorf("%q and %q differ", last[0], last[1])
	}
	for _, in := range []string{"a=%", "a=%1", "a=%zz", "%g0=1", "a=1;b=2", "a;=1", "a=%%31", "=%"} {
		if _, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: formType, Body: []byte(in)}); !errors.Is(err, ErrInvalidForm) {
			t.Errorf("Sum(%q) error = %v, want ErrInvalidForm", in, err)
		}
	}
	// Fields.
	base := sum("amount=100&currency=usd&nonce=1", "amount", "currency")
	if sum("nonce=2&currency=usd&amount=100", "amount", "currency") != base {
		t.Error("unselected key changed the fingerprint")
	}
	if sum("amount=100", "amount", "currency") == base {
		t.Error("removing a selected key kept the fingerprint")
	}
	if sum("a=", "a") == sum("", "a") {
		t.Error("missing key equals empty value")
	}
	if sum("a=1&a=2", "a") == sum("a=2&a=1", "a") {
		t.Error("order of repeated values ignored")
	}
	if sum("a=1", "a") == sum("a=1") {
		t.Error("fields mode equals whole-form mode")
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	for _, secret := range [][]byte{nil, []byte("k")} {
		h := New(secret)
		bodies := []struct{ ct, body string }{
			{jsonType, `{"b":[1,2,{"d":4,"c":3}],"a":"x"}`},
			{jsonType, `{"a":12345678901234567890}`},
			{formType, "b=2&a=1"},
			{"", "raw"},
		}
		want := make([]string, len(bodies))
		for i, b := range bodies {
			want[i] = mustSum(t, h, "POST", "/", b.ct, b.body)
		}
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < 200; n++ {
					i := (g + n) % len(bodies)
					got, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: bodies[i].ct, Body: []byte(bodies[i].body)})
					if err != nil || got != want[i] {
						t.Errorf("concurrent Sum = %s, %v; want %s", got, err, want[i])
						return
					}
				}
			}()
		}
		wg.Wait()
	}
}

func TestSumAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	h := New(nil)
	keyed := New([]byte("secret"))
	cases := []struct {
		name   string
		h      *Hasher
		ct     string
		body   []byte
		fields []string
		atMost float64
	}{
		{"json-small", h, jsonType, smallJSON, nil, 1},
		{"json-small-hmac", keyed, jsonType, smallJSON, nil, 1},
		{"json-fields", h, jsonType, smallJSON, []string{"amount", "currency"}, 1},
		{"form", h, formType, smallForm, nil, 1},
		{"raw", h, "text/plain", smallJSON, nil, 1},
	}
	for _, c := range cases {
		// Warm the pool so the first Get does not count.
		c.h.Sum(Input{Method: "POST", Route: "/v1/charges", Target: "/v1/charges?expand=customer&limit=3", ContentType: c.ct, Body: c.body, Fields: c.fields})
		n := testing.AllocsPerRun(200, func() {
			if _, err := c.h.Sum(Input{Method: "POST", Route: "/v1/charges", Target: "/v1/charges?expand=customer&limit=3", ContentType: c.ct, Body: c.body, Fields: c.fields}); err != nil {
				t.Fatal(err)
			}
		})
		if n > c.atMost {
			t.Errorf("%s: %v allocations per Sum, want at most %v", c.name, n, c.atMost)
		}
	}
}

var (
	smallJSON = []byte(`{"amount":2000,"currency":"usd","customer":"cus_9s6XKzkNRiz8i3","description":"Order #1042","capture":true}`)
	smallForm = []byte("amount=2000&currency=usd&customer=cus_9s6XKzkNRiz8i3&description=Order+%231042&capture=true")
)

func BenchmarkSum(b *testing.B) {
	h := New(nil)
	keyed := New([]byte("a server secret of some length"))
	medium := []byte(`{"items":[{"sku":"A-1","qty":2,"price":19.99},{"sku":"B-22","qty":1,"price":5.5}],"shipping":{"name":"Zoë Ünal","address":"1 Rue de l\u2019Église","zip":"75001"},"total":45.48,"metadata":{"z":"1","a":"2"}}`)
	cases := []struct {
		name   string
		h      *Hasher
		ct     string
		body   []byte
		fields []string
	}{
		{"json-small", h, jsonType, smallJSON, nil},
		{"json-small-hmac", keyed, jsonType, smallJSON, nil},
		{"json-medium", h, jsonType, medium, nil},
		{"json-fields", h, jsonType, smallJSON, []string{"amount", "currency"}},
		{"form", h, formType, smallForm, nil},
		{"raw", h, "application/octet-stream", smallJSON, nil},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := c.h.Sum(Input{Method: "POST", Route: "/v1/charges", ContentType: c.ct, Body: c.body, Fields: c.fields}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// The reference canonicaliser plus a hash, for comparison.
	b.Run("jcs-transform-small", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(smallJSON)))
		for b.Loop() {
			out, err := jcs.Transform(smallJSON)
			if err != nil {
				b.Fatal(err)
			}
			sha256.Sum256(out)
		}
	})
}

// TestFormFieldsIgnoreOtherKeys checks that a form fingerprinted by
// selected keys does not depend on the keys it does not select: how many
// there are, and where they sort among the selected ones.
func TestFormFieldsIgnoreOtherKeys(t *testing.T) {
	t.Parallel()
	h := New(nil)
	fields := []string{"amount", "currency"}
	want := mustSum(t, h, "POST", "/", formType, "amount=100&currency=usd", fields...)
	for _, body := range []string{
		"_ts=1&amount=100&currency=usd",
		"a=1&aa=2&amount=100&currency=usd",
		"amount=100&b=1&currency=usd",
		"amount=100&currency=usd&nonce=7",
		"z=1&currency=usd&amount=100&a=0&c=2",
	} {
		if got := mustSum(t, h, "POST", "/", formType, body, fields...); got != want {
			t.Errorf("%q and %q differ in their selected keys only", body, "amount=100&currency=usd")
		}
	}
}

// TestJSONCutOff checks that a JSON body cut off anywhere (a truncated
// upload) is invalid: Sum reads no byte past the end of the body, whatever
// its capacity, and never accepts or fails on what is not there.
func TestJSONCutOff(t *testing.T) {
	t.Parallel()
	h := New(nil)
	docs := []string{
		`{"a":[1,-2.5e3,true,false,null],"b":{"c":"x\"\\y\u00e9\ud83d\ude02"},"d":{}}`,
		`[{"k":"v"},[[]],"\n",0]`,
	}
	for _, doc := range docs {
		mustSum(t, h, "POST", "/", jsonType, doc)
		for n := range len(doc) {
			body := []byte(doc[:n])
			body = body[:n:n]
			if _, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: jsonType, Body: body}); !errors.Is(err, ErrInvalidJSON) {
				t.Errorf("Sum(%q) error = %v, want ErrInvalidJSON", body, err)
			}
		}
	}
}
