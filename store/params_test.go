package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem/store"
)

func TestErrorText(t *testing.T) {
	for in, want := range map[string]string{
		"upstream 503":           "upstream 503",
		"a\x00b":                 "ab",
		"bad \xff byte":          "bad \uFFFD byte",
		strings.Repeat("é", 600): strings.Repeat("é", store.MaxErrorBytes/2),
		// A text of exactly MaxErrorBytes is kept whole.
		strings.Repeat("x", store.MaxErrorBytes): strings.Repeat("x", store.MaxErrorBytes),
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

// TestReserveParamsDurations: a reservation needs a positive lease and a
// positive TTL; a zero TTL would make a record that expires as it is made.
func TestReserveParamsDurations(t *testing.T) {
	for name, c := range map[string]struct {
		lease, ttl time.Duration
		ok         bool
	}{
		"positive":       {time.Second, time.Hour, true},
		"shortest":       {time.Nanosecond, time.Nanosecond, true},
		"zero lease":     {0, time.Hour, false},
		"zero ttl":       {time.Second, 0, false},
		"negative ttl":   {time.Second, -time.Hour, false},
		"negative lease": {-time.Second, time.Hour, false},
	} {
		p := store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: c.lease, TTL: c.ttl, LeasePolicy: store.LeaseUnknown}
		if err := p.Validate(); (err == nil) != c.ok || (err != nil && !errors.Is(err, store.ErrInvalidParams)) {
			t.Errorf("%s: %v, want valid %v", name, err, c.ok)
		}
	}
}

// TestResponseStatusRange: a stored status is one net/http can write back
// on a replay, 100 through 999, bounds included.
func TestResponseStatusRange(t *testing.T) {
	for status, ok := range map[int]bool{99: false, 100: true, 201: true, 999: true, 1000: false} {
		r := store.Response{Status: status}
		if err := r.Validate(); (err == nil) != ok || (err != nil && !errors.Is(err, store.ErrInvalidParams)) {
			t.Errorf("status %d: %v, want valid %v", status, err, ok)
		}
	}
}
