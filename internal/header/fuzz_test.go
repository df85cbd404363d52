package header

import (
	"errors"
	"testing"

	"github.com/dunglas/httpsfv"
)

var fuzzSeeds = []string{
	`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324",
	`""`, "", " ", `"a\"b"`, `"a\\b"`, `"abc";x=1`, `"a", "b"`, "a, b", `"abc`, `"`,
	"\"a\tb\"", "a b", "\"caf\xc3\xa9\"", `"a";`, `"a" `, ` "a"`, `"a"b`, `%"a"`, `:YWJj:`, `?1`,
}

// FuzzParse checks that Parse never panics, that every key it returns is
// within the documented alphabet and length, and that re-spelling a key in
// the quoted form yields the same key.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := Parse([]string{v})
		if err != nil {
			for _, want := range []error{ErrRepeated, ErrEmpty, ErrTooLong, ErrMalformed} {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("Parse(%q): unexpected error %v", v, err)
		}
		if key == "" || len(key) > MaxLen {
			t.Fatalf("Parse(%q) = %q: bad length", v, key)
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c < 0x20 || c > 0x7e {
				t.Fatalf("Parse(%q) = %q: byte %#x", v, key, c)
			}
		}
		quoted, err := httpsfv.Marshal(httpsfv.NewItem(key))
		if err != nil {
			t.Fatalf("marshal %q: %v", key, err)
		}
		if again, err := Parse([]string{quoted}); err != nil || again != key {
			t.Fatalf("Parse(%q) = %q, but its quoted form %q gives %q, %v", v, key, quoted, again, err)
		}
	})
}

// FuzzQuotedFastPath proves the allocation-free path agrees with httpsfv on
// every input it accepts.
func FuzzQuotedFastPath(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if len(v) == 0 || v[0] != '"' {
			v = `"` + v
		}
		fast, ok := parseQuotedFast(v)
		if !ok {
			return
		}
		item, err := httpsfv.UnmarshalItem([]string{v})
		if err != nil {
			t.Fatalf("fast path accepted %q as %q, httpsfv rejects it: %v", v, fast, err)
		}
		s, isString := item.Value.(string)
		if !isString || s != fast {
			t.Fatalf("fast path gives %q for %q, httpsfv gives %#v", fast, v, item.Value)
		}
		if names := item.Params.Names(); len(names) != 0 {
			t.Fatalf("fast path accepted %q which has parameters %v", v, names)
		}
	})
}
