package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

func TestMicrosRoundsUp(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second:                   0,
		0:                              0,
		time.Nanosecond:                1,
		time.Microsecond:               1,
		time.Microsecond + 1:           2,
		30*time.Second + 999:           30_000_001,
		time.Duration(1<<62) + 1:       (1<<62)/1000 + 1,
		time.Duration(1<<63 - 1):       (1<<63-1)/1000 + 1,
		24*time.Hour - time.Nanosecond: 86_400_000_000,
	} {
		if got := store.Micros(d); got != want {
			t.Errorf("Micros(%d) = %d, want %d", d, got, want)
		}
	}
}

func TestNextFence(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 6789, time.UTC)
	us := now.UnixMicro()
	for _, c := range []struct {
		prev int64
		now  time.Time
		want int64
	}{
		{0, now, us},              // a new record: the clock
		{us - 10, now, us},        // a later issue: the clock
		{us, now, us + 1},         // same microsecond: one more
		{us + 500, now, us + 501}, // clock set back: one more
		{0, time.Unix(0, 0), 1},   // never zero or negative
		{0, time.Unix(-5, 0), 1},  // (a clock before 1970)
		{7, time.Unix(0, 0).Add(-time.Hour), 8},
	} {
		if got := store.NextFence(c.prev, c.now); got != c.want {
			t.Errorf("NextFence(%d, %v) = %d, want %d", c.prev, c.now, got, c.want)
		}
	}
}

func TestIsRetryable(t *testing.T) {
	driver := errors.New("connection reset by peer")
	wrapped := fmt.Errorf("idem/x: reserve: %w", store.Retryable(driver))
	if !store.IsRetryable(wrapped) || !errors.Is(wrapped, driver) {
		t.Fatalf("a wrapped retryable error: IsRetryable %v, reaches the driver error %v",
			store.IsRetryable(wrapped), errors.Is(wrapped, driver))
	}
	var re *store.RetryableError
	if !errors.As(wrapped, &re) || re.Err != driver {
		t.Fatalf("errors.As: %v", re)
	}
	if store.Retryable(nil) != nil {
		t.Fatal("Retryable(nil) is not nil")
	}
	for _, err := range []error{
		nil,
		driver, // not marked by a store
		io.EOF,
		store.ErrLeaseLost, store.ErrNotFound, store.ErrStateConflict, store.ErrInvalidParams, store.ErrTooLong,
		// Definite answers and the caller's own end stay final even if
		// something marked them.
		store.Retryable(store.ErrLeaseLost),
		fmt.Errorf("x: %w", store.Retryable(fmt.Errorf("y: %w", store.ErrNotFound))),
		store.Retryable(context.Canceled),
		store.Retryable(fmt.Errorf("read: %w", context.DeadlineExceeded)),
	} {
		if store.IsRetryable(err) {
			t.Errorf("IsRetryable(%v) = true", err)
		}
	}
}

func TestDecide(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	p := &store.ReserveParams{Fingerprint: "fp"}
	rec := func(st store.State, fp string, pol store.LeasePolicy, lockedUntil, expires time.Time) *store.Record {
		return &store.Record{State: st, Fingerprint: fp, LeasePolicy: pol, LockedUntil: lockedUntil, ExpiresAt: expires}
	}
	past, future := now.Add(-time.Second), now.Add(time.Second)
	for name, c := range map[string]struct {
		r    *store.Record
		want store.Action
	}{
		"expired, other fingerprint":   {rec(store.StateExpired, "x", store.LeaseUnknown, past, future), store.ActCreate},
		"completed past expiry":        {rec(store.StateCompleted, "x", store.LeaseUnknown, past, now), store.ActCreate},
		"completed":                    {rec(store.StateCompleted, "fp", store.LeaseUnknown, past, future), store.ActExisting},
		"failed, other fingerprint":    {rec(store.StateFailedRetryable, "x", store.LeaseUnknown, past, future), store.ActExisting},
		"failed":                       {rec(store.StateFailedRetryable, "fp", store.LeaseUnknown, past, future), store.ActReclaim},
		"failed past expiry":           {rec(store.StateFailedRetryable, "x", store.LeaseUnknown, past, past), store.ActCreate},
		"live lease":                   {rec(store.StateInProgress, "fp", store.LeaseRetry, future, future), store.ActExisting},
		"lease ends now, retry":        {rec(store.StateInProgress, "fp", store.LeaseRetry, now, future), store.ActTakeOver},
		"expired lease, resume":        {rec(store.StateInProgress, "fp", store.LeaseResume, past, future), store.ActTakeOver},
		"expired lease, unknown":       {rec(store.StateInProgress, "fp", store.LeaseUnknown, past, future), store.ActLeaseExpired},
		"expired lease, other request": {rec(store.StateInProgress, "x", store.LeaseRetry, past, future), store.ActExisting},
		"unknown past its lease":       {rec(store.StateUnknown, "fp", store.LeaseRetry, past, future), store.ActExisting},
		"unknown past expiry":          {rec(store.StateUnknown, "fp", store.LeaseRetry, past, past), store.ActExisting},
	} {
		if got := store.Decide(c.r, p, now); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}
