package fingerprint

import (
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"
)

type amplificationBody struct {
	name string
	body []byte
}

// contentType is JSON but for the bodies named form-*.
func (b amplificationBody) contentType() string {
	if strings.HasPrefix(b.name, "form-") {
		return formType
	}
	return jsonType
}

// amplificationBodies are JSON and form documents of about size bytes built to be
// expensive to fingerprint. The first, small integers, is the baseline the
// others are compared with.
func amplificationBodies(size int) []amplificationBody {
	array := func(item func(i int) string) []byte {
		var b strings.Builder
		b.WriteByte('[')
		for i := 0; b.Len() < size-64; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(item(i))
		}
		b.WriteByte(']')
		return []byte(b.String())
	}
	// object has distinct member names in no particular order.
	object := func(name func(i int) string) []byte {
		var b strings.Builder
		b.WriteByte('{')
		for i := 0; b.Len() < size-64; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + name(i) + `":0`)
		}
		b.WriteByte('}')
		return []byte(b.String())
	}
	form := func(pair func(i int) string) []byte {
		var b strings.Builder
		for i := 0; b.Len() < size-64; i++ {
			if i > 0 {
				b.WriteByte('&')
			}
			b.WriteString(pair(i))
		}
		return []byte(b.String())
	}
	repeat := func(items ...string) func(int) string {
		return func(i int) string { return items[i%len(items)] }
	}
	subnormals := []string{"5e-324", "1e-310", "2.225073858507201e-308", "1.23e-320", "-4e-323", "1e-323"}
	return []amplificationBody{
		{"ints", array(func(i int) string { return strconv.Itoa(i % 1000) })},
		{"subnormal-min", array(repeat("5e-324"))},
		{"subnormals", array(repeat(subnormals...))},
		{"long-mantissa", array(repeat("0.1000000000000000055511151231257827"))},
		{"long-mantissa-exact", array(repeat("1.00000000000000000000000000000000000000000000e0", "0.500000000000000000000000000000000000"))},
		{"huge-exponents", array(repeat("1e308", "1.7976931348623157e308", "-8.98846567431158e307", "1e-307", "1.5e+300"))},
		{"out-of-range", array(repeat("1e99999999", "1e-99999999", "1e400", "1e-400", "-0"))},
		{"17-digits", array(repeat("0.30000000000000004", "1.2345678901234567e89", "1.0000000000000002", "123456789012345.67"))},
		{"notation", array(repeat("1.5e0", "2E+3", "25e-1", "1.0"))},
		{"escaped-strings", array(repeat(`"\u00e9\ud83d\ude02\n\t\"\\"`))},
		{"nested", []byte(strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + strings.Repeat(" ", size-2*MaxDepth))},
		{"wide-object", object(func(i int) string { return `a` + strconv.Itoa(i*7919%1000003) })},
		{"wide-object-escaped", object(func(i int) string { return `\u0061` + strconv.Itoa(i*7919%1000003) })},
		{"wide-object-long-escaped", object(func(i int) string {
			return strings.Repeat(`\u00e9`, 16) + strconv.Itoa(i*7919%1000003)
		})},
		{"wide-object-non-ascii", object(func(i int) string { return strings.Repeat("é", 16) + strconv.Itoa(i*7919%1000003) })},
		// Form bodies: sorting many keys, decoding escapes, one key repeated.
		{"form-keys", form(func(i int) string { return "k" + strconv.Itoa(i*7919%1000003) + "=v" })},
		{"form-escapes", form(func(i int) string { return "%41%42%43%44=%45%46%47%48+%49" })},
		{"form-one-key", form(func(i int) string { return "a=" + strconv.Itoa(i%10) })},
	}
}

// BenchmarkAmplification fingerprints each 1 MiB worst-case body and
// reports its cost as a multiple of the small-integer baseline measured in
// the same run: x-ints by the process's CPU time (garbage collection
// included, other processes excluded), x-ints-wall by wall time. No body
// should cost much more than the baseline: a client must not buy seconds of
// CPU with a megabyte.
func BenchmarkAmplification(b *testing.B) {
	h := New(nil)
	var baseCPU, baseWall float64
	for _, c := range amplificationBodies(1 << 20) {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			cpu, wall := cpuTime(), time.Now()
			for b.Loop() {
				if _, err := h.Sum(Input{Method: "POST", Route: "/", ContentType: c.contentType(), Body: c.body}); err != nil {
					b.Fatal(err)
				}
			}
			perCPU := float64(cpuTime()-cpu) / float64(b.N)
			perWall := float64(time.Since(wall)) / float64(b.N)
			if c.name == "ints" {
				baseCPU, baseWall = perCPU, perWall
			}
			b.ReportMetric(perCPU/baseCPU, "x-ints")
			b.ReportMetric(perWall/baseWall, "x-ints-wall")
		})
	}
}

// numberWork canonicalises body and returns the work its numbers cost: the
// subnormal candidates met and the numbers handed to strconv.
func numberWork(t *testing.T, body []byte) (slow, parsed int, guarded bool) {
	t.Helper()
	s := New(nil).pool.Get().(*state)
	s.w = io.Discard
	if err := s.parse(body); err != nil {
		t.Fatal(err)
	}
	if _, err := s.emitValue(0, true); err != nil {
		t.Fatal(err)
	}
	return s.slowNumbers, s.parsedNumbers, s.guarded
}

// TestNumberWorkIsBounded counts, rather than times, the expensive number
// conversions: whatever the body, at most maxSlowNumbers numbers go through
// strconv's arbitrary-precision path, numbers that cannot keep their value
// never reach strconv, and once one number has guarded the body no other is
// converted.
func TestNumberWorkIsBounded(t *testing.T) {
	t.Parallel()
	for _, c := range amplificationBodies(64 << 10) {
		if c.contentType() != jsonType {
			continue
		}
		slow, parsed, guarded := numberWork(t, c.body)
		if slow > maxSlowNumbers+1 {
			t.Errorf("%s: %d numbers took the slow path, want at most %d", c.name, slow, maxSlowNumbers+1)
		}
		t.Logf("%s: slow %d, parsed %d, guarded %v", c.name, slow, parsed, guarded)
	}
	many := func(n int, num string) []byte {
		return []byte("[" + strings.TrimSuffix(strings.Repeat(num+",", n), ",") + "]")
	}
	// Up to the bound, subnormals are canonicalised like any number.
	if slow, parsed, guarded := numberWork(t, many(maxSlowNumbers, "5e-324")); guarded || slow != maxSlowNumbers || parsed != maxSlowNumbers {
		t.Errorf("%d subnormals: slow %d, parsed %d, guarded %v", maxSlowNumbers, slow, parsed, guarded)
	}
	// One more and the body is hashed raw; the conversions stop there.
	if slow, parsed, guarded := numberWork(t, many(10000, "5e-324")); !guarded || slow != maxSlowNumbers+1 || parsed != maxSlowNumbers {
		t.Errorf("10000 subnormals: slow %d, parsed %d, guarded %v", slow, parsed, guarded)
	}
	// Too many digits, or out of range: decided from the text alone.
	for _, num := range []string{"0.1000000000000000055511151231257827", "1e400", "1e-400", "-0", "12345678901234567890"} {
		if _, parsed, guarded := numberWork(t, many(1000, num)); !guarded || parsed != 0 {
			t.Errorf("%s: parsed %d, guarded %v; want guarded without parsing", num, parsed, guarded)
		}
	}
	// After the first guard, nothing more is converted.
	if _, parsed, guarded := numberWork(t, []byte("[1.5e0,1.5e1,333333333.33333329"+strings.Repeat(",1.5e0", 1000)+"]")); !guarded || parsed != 3 {
		t.Errorf("parsed %d, guarded %v; want 3 and guarded", parsed, guarded)
	}
}

// TestSubnormals: the bound changes no decision below it. Each number is
// canonicalised or guarded exactly as a full conversion would decide.
func TestSubnormals(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, want string // want "" means guarded
	}{
		{"5e-324", "5e-324"},
		{"-5e-324", "-5e-324"},
		{"4.9e-324", ""}, // rounds to 5e-324
		{"4e-324", ""},
		{"2.4e-324", ""}, // rounds to zero
		{"1e-324", ""},
		{"0.1e-322", "1e-323"},
		{"1e-323", "1e-323"},
		{"10e-324", "1e-323"},
		{"1.23e-320", "1.23e-320"},
		{"2.225073858507201e-308", "2.225073858507201e-308"},
		{"2.2250738585072014e-308", "2.2250738585072014e-308"},
		{"22250738585072014e-324", "2.2250738585072014e-308"},
		{"2.2250738585072011e-308", ""},
		{"1e-307", "1e-307"},
		{"1.7976931348623157e308", "1.7976931348623157e+308"},
		{"1.7976931348623158e308", ""},
		{"1.7976931348623159e308", ""},
		{"179769313486231570" + strings.Repeat("0", 291), "1.7976931348623157e+308"},
		{"0." + strings.Repeat("0", 323) + "5", "5e-324"},
		{"0.0e-99999", "0"},
	} {
		got, guarded, err := canonical(t, []byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		if ref, refGuarded := refNumber(c.in); ref != c.want || refGuarded != (c.want == "") {
			t.Errorf("%.30s: the reference gives %q guarded=%v; the table says %q", c.in, ref, refGuarded, c.want)
		}
		if guarded != (c.want == "") || (!guarded && string(got) != c.want) {
			t.Errorf("%.30s: got %q guarded=%v, want %q", c.in, got, guarded, c.want)
		}
	}
}

// refNumber is the plain decision: convert the whole text, format it per
// RFC 8785, keep it if the decimal value is unchanged.
func refNumber(num string) (string, bool) {
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return "", true
	}
	canon, err := jcs.NumberToJSON(f)
	if err != nil || !sameDecimal(num, canon) {
		return "", true
	}
	return canon, false
}
