package header

import (
	"errors"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"
)

func TestParse(t *testing.T) {
	t.Parallel()
	uuid := "8e03978e-40d5-43e8-bc93-6894a57f9324"
	max := strings.Repeat("k", MaxLen)
	over := strings.Repeat("k", MaxLen+1)
	tests := []struct {
		name    string
		values  []string
		want    string
		wantErr error
	}{
		{"missing", nil, "", ErrMissing},
		{"missing empty slice", []string{}, "", ErrMissing},
		{"repeated lines", []string{`"a"`, `"b"`}, "", ErrRepeated},
		{"repeated identical lines", []string{`"a"`, `"a"`}, "", ErrRepeated},
		{"list of quoted strings", []string{`"a", "b"`}, "", ErrRepeated},
		{"list mixing quoted and bare", []string{`"a", b`}, "", ErrRepeated},
		{"bare list", []string{`a, b`}, "", ErrRepeated},
		{"bare list without space", []string{`a,b`}, "", ErrRepeated},
		{"bare lone comma", []string{`a,`}, "", ErrMalformed},
		{"bare leading comma", []string{`,abc`}, "", ErrMalformed},
		{"only a comma", []string{`,`}, "", ErrMalformed},
		{"empty value", []string{""}, "", ErrEmpty},
		{"only whitespace", []string{" \t "}, "", ErrEmpty},
		{"empty quoted string", []string{`""`}, "", ErrEmpty},
		{"empty quoted string with parameters", []string{`"";a=1`}, "", ErrEmpty},
		{"quoted uuid", []string{`"` + uuid + `"`}, uuid, nil},
		{"bare uuid", []string{uuid}, uuid, nil},
		{"quoted with surrounding whitespace", []string{" \t\"abc\" \t"}, "abc", nil},
		{"bare with surrounding whitespace", []string{" \tabc\t "}, "abc", nil},
		{"quoted exactly 255", []string{`"` + max + `"`}, max, nil},
		{"bare exactly 255", []string{max}, max, nil},
		{"quoted 256", []string{`"` + over + `"`}, "", ErrTooLong},
		{"bare 256", []string{over}, "", ErrTooLong},
		{"escapes count as one character", []string{`"` + strings.Repeat(`\"`, MaxLen) + `"`}, strings.Repeat(`"`, MaxLen), nil},
		{"control char in quoted", []string{"\"a\x01b\""}, "", ErrMalformed},
		{"control char in bare", []string{"a\x01b"}, "", ErrMalformed},
		{"DEL in bare", []string{"a\x7fb"}, "", ErrMalformed},
		{"NUL in quoted", []string{"\"a\x00b\""}, "", ErrMalformed},
		{"tab inside quoted", []string{"\"a\tb\""}, "", ErrMalformed},
		{"tab inside bare", []string{"a\tb"}, "", ErrMalformed},
		{"space inside quoted", []string{`"a b"`}, "a b", nil},
		{"space inside bare", []string{"a b"}, "", ErrMalformed},
		{"non-ASCII in quoted", []string{`"café"`}, "", ErrMalformed},
		{"non-ASCII in bare", []string{"café"}, "", ErrMalformed},
		{"unterminated quote", []string{`"abc`}, "", ErrMalformed},
		{"lone quote", []string{`"`}, "", ErrMalformed},
		{"escaped quote", []string{`"a\"b"`}, `a"b`, nil},
		{"escaped backslash", []string{`"a\\b"`}, `a\b`, nil},
		{"invalid escape", []string{`"a\nb"`}, "", ErrMalformed},
		{"trailing backslash", []string{`"a\`}, "", ErrMalformed},
		{"parameters ignored", []string{`"abc";x=1`}, "abc", nil},
		{"several parameters ignored", []string{`"abc";x=1;y="z";flag`}, "abc", nil},
		{"malformed parameters", []string{`"abc";X=1`}, "", ErrMalformed},
		{"garbage after string", []string{`"abc"def`}, "", ErrMalformed},
		{"bare token", []string{"abc_123:xyz/.~"}, "abc_123:xyz/.~", nil},
		{"bare from ! to ~", []string{"!abc~"}, "!abc~", nil},
		{"bare with quote inside", []string{`ab"c`}, `ab"c`, nil},
		{"bare looks like sf-integer", []string{"12345"}, "12345", nil},
		{"bare with semicolon is taken whole", []string{"abc;x=1"}, "abc;x=1", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse(tt.values)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Parse(%q) error = %v, want %v", tt.values, err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("Parse(%q) = %q, want %q", tt.values, got, tt.want)
			}
		})
	}
}

func TestQuotedAndBareAreOneKey(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"abc", "8e03978e-40d5-43e8-bc93-6894a57f9324", "a:b/c", `a"b`, `a\b`} {
		bare, err := Parse([]string{k})
		if err != nil {
			t.Fatalf("bare %q: %v", k, err)
		}
		quotedValue, err := httpsfv.Marshal(httpsfv.NewItem(k))
		if err != nil {
			t.Fatal(err)
		}
		quoted, err := Parse([]string{quotedValue})
		if err != nil {
			t.Fatalf("quoted %q: %v", quotedValue, err)
		}
		if bare != quoted || bare != k {
			t.Fatalf("bare %q and quoted %q give %q and %q", k, quotedValue, bare, quoted)
		}
	}
}

func TestParseQuotedUUIDDoesNotAllocate(t *testing.T) {
	values := []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}
	bare := []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}
	var sink string
	if n := testing.AllocsPerRun(1000, func() { sink, _ = Parse(values) }); n != 0 {
		t.Fatalf("quoted: %v allocations per Parse, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { sink, _ = Parse(bare) }); n != 0 {
		t.Fatalf("bare: %v allocations per Parse, want 0", n)
	}
	_ = sink
}

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct{ name, value string }{
		{"quoted", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`},
		{"bare", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"params", `"8e03978e-40d5-43e8-bc93-6894a57f9324";v=1`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			values := []string{bc.value}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(values); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
