package store_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-go/idem/store"
)

func TestErrorText(t *testing.T) {
	for in, want := range map[string]string{
		"upstream 503":           "upstream 503",
		"a\x00b":                 "ab",
		"bad \xff byte":          "bad \uFFFD byte",
		strings.Repeat("é", 600): strings.Repeat("é", store.MaxErrorBytes/2),
	} {
		if got := store.ErrorText(in); got != want {
			t.Errorf("store.ErrorText(%.20q) = %.20q (%d bytes), want %.20q", in, got, len(got), want)
		}
	}
	long := "x" + strings.Repeat("é", 600) // an odd cut would split a character
	if got := store.ErrorText(long); !utf8.ValidString(got) || len(got) > store.MaxErrorBytes || len(got) < store.MaxErrorBytes-1 {
		t.Errorf("ErrorText of %d bytes: %d bytes, valid %v", len(long), len(got), utf8.ValidString(got))
	}
}
