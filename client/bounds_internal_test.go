package client

import (
	"context"
	"testing"
	"time"
)

// The waits' sum may reach MaxDelay exactly; a wait that ends exactly at
// the context's deadline is not begun, as it would leave the next attempt
// no time at all.
func TestDelayAtTheBounds(t *testing.T) {
	s, err := (&Transport{Jitter: func(d time.Duration) time.Duration { return d }, Now: func() time.Time { return now }}).settings()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d, ok := s.delay(ctx, 1, ReasonNetwork, 0, 0, DefaultMaxDelay-DefaultBaseDelay); !ok || d != DefaultBaseDelay {
		t.Errorf("a wait that brings the sum to MaxDelay: %v %v", d, ok)
	}
	dctx, cancel := context.WithDeadline(ctx, now.Add(DefaultBaseDelay))
	defer cancel()
	if d, ok := s.delay(dctx, 1, ReasonNetwork, 0, 0, 0); ok {
		t.Errorf("a wait of %v that ends at the deadline", d)
	}
}

// The tiniest waits are spread too, within [d/2, d], and never make the
// draw fail.
func TestJitterTinyWaits(t *testing.T) {
	for d := time.Duration(2); d <= 16; d++ {
		for range 100 {
			if j := jitter(d); j < d/2 || j > d {
				t.Fatalf("jitter(%v) = %v, outside [d/2, d]", d, j)
			}
		}
	}
}
