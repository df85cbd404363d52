package client

import (
	"context"
	"net/http"
	"testing"
	"time"
)

var now = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   time.Duration
		ok     bool
	}{
		{nil, 0, false},
		{[]string{"0"}, 0, true},
		{[]string{"5"}, 5 * time.Second, true},
		{[]string{" 5 "}, 5 * time.Second, true},
		{[]string{"120"}, 2 * time.Minute, true},
		{[]string{"99999999999999999999999"}, maxWait, true},
		{[]string{"9223372036854775807"}, maxWait, true},
		{[]string{now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, true},
		{[]string{"Mon, 23 Nov 2026 08:59:00 GMT"}, 0, true},                 // in the past
		{[]string{"Monday, 23-Nov-26 09:00:30 GMT"}, 30 * time.Second, true}, // RFC 850
		{[]string{"Mon Nov 23 09:00:10 2026"}, 10 * time.Second, true},       // asctime
		{[]string{""}, 0, false},
		{[]string{"-1"}, 0, false},
		{[]string{"1.5"}, 0, false},
		{[]string{"5s"}, 0, false},
		{[]string{"soon"}, 0, false},
		{[]string{"1", "2"}, 0, false},
	} {
		h := http.Header{"Retry-After": tc.values}
		got, ok := retryAfter(h, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Retry-After %q: %v %v, want %v %v", tc.values, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzRetryAfter checks that no value makes a negative wait, and that a
// value is either understood or reported as not understood with no wait.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "5", "-1", "99999999999999999999", "Mon, 23 Nov 2026 09:01:00 GMT", "x", " 7", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := retryAfter(http.Header{"Retry-After": {v}}, now)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("%q: %v %v", v, d, ok)
		}
	})
}

func TestDoubled(t *testing.T) {
	for _, tc := range []struct {
		base  time.Duration
		n     int
		limit time.Duration
		want  time.Duration
	}{
		{time.Second, 0, time.Minute, time.Second},
		{time.Second, 3, time.Minute, 8 * time.Second},
		{time.Second, 10, time.Minute, time.Minute},
		{time.Second, 1000, maxWait, maxWait}, // no overflow
		{3 * time.Second, 1, 5 * time.Second, 5 * time.Second},
	} {
		if got := doubled(tc.base, tc.n, tc.limit); got != tc.want {
			t.Errorf("doubled(%v, %d, %v) = %v, want %v", tc.base, tc.n, tc.limit, got, tc.want)
		}
	}
}

func TestJitter(t *testing.T) {
	const d = 10 * time.Second
	lowest, highest := d, time.Duration(0)
	for range 10000 {
		j := jitter(d)
		if j < d/2 || j > d {
			t.Fatalf("jitter(%v) = %v, outside [d/2, d]", d, j)
		}
		lowest, highest = min(lowest, j), max(highest, j)
	}
	// Spread, or it would not spread anyone: 10000 draws cover most of
	// the range.
	if lowest > d/2+d/10 || highest < d-d/10 {
		t.Errorf("draws within [%v, %v]", lowest, highest)
	}
	if jitter(0) != 0 || jitter(1) != 1 {
		t.Error("jitter of a zero wait")
	}
}

func TestDelayBounds(t *testing.T) {
	s, err := (&Transport{Jitter: func(d time.Duration) time.Duration { return d }, Now: func() time.Time { return now }}).settings()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d, ok := s.delay(ctx, 1, ReasonNetwork, 0, 0, 0); !ok || d != DefaultBaseDelay {
		t.Errorf("first retry: %v %v", d, ok)
	}
	if d, ok := s.delay(ctx, 4, ReasonNetwork, 0, 0, 0); !ok || d != 4*time.Second {
		t.Errorf("fourth retry: %v %v", d, ok)
	}
	if _, ok := s.delay(ctx, DefaultMaxAttempts, ReasonNetwork, 0, 0, 0); ok {
		t.Error("a retry after the last attempt")
	}
	if _, ok := s.delay(ctx, 1, ReasonUnavailable, 0, maxWait, 0); ok {
		t.Error("waited for an unrepresentable Retry-After")
	}
	if _, ok := s.delay(ctx, 1, ReasonNetwork, 0, 0, DefaultMaxDelay-time.Millisecond); ok {
		t.Error("waited past MaxDelay")
	}
	dctx, cancel := context.WithDeadline(ctx, now.Add(time.Second))
	defer cancel()
	if _, ok := s.delay(dctx, 1, ReasonUnavailable, 0, 2*time.Second, 0); ok {
		t.Error("waited past the context's deadline")
	}
	if d, ok := s.delay(dctx, 1, ReasonNetwork, 0, 0, 0); !ok || d != DefaultBaseDelay {
		t.Errorf("a wait within the deadline: %v %v", d, ok)
	}
	s.RetryUnknown = time.Minute
	s.MaxDelay = time.Hour
	if d, ok := s.delay(ctx, 1, ReasonOutcomeUnknown, 2, 0, 0); !ok || d != 2*time.Minute {
		t.Errorf("second unknown: %v %v", d, ok)
	}
}
