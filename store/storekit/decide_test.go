package storekit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
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
		if got := storekit.Micros(d); got != want {
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
		if got := storekit.NextFence(c.prev, c.now); got != c.want {
			t.Errorf("NextFence(%d, %v) = %d, want %d", c.prev, c.now, got, c.want)
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
		want storekit.Action
	}{
		"expired, other fingerprint":   {rec(store.StateExpired, "x", store.LeaseUnknown, past, future), storekit.ActCreate},
		"completed past expiry":        {rec(store.StateCompleted, "x", store.LeaseUnknown, past, now), storekit.ActCreate},
		"completed":                    {rec(store.StateCompleted, "fp", store.LeaseUnknown, past, future), storekit.ActExisting},
		"failed, other fingerprint":    {rec(store.StateFailedRetryable, "x", store.LeaseUnknown, past, future), storekit.ActExisting},
		"failed":                       {rec(store.StateFailedRetryable, "fp", store.LeaseUnknown, past, future), storekit.ActReclaim},
		"failed past expiry":           {rec(store.StateFailedRetryable, "x", store.LeaseUnknown, past, past), storekit.ActCreate},
		"live lease":                   {rec(store.StateInProgress, "fp", store.LeaseRetry, future, future), storekit.ActExisting},
		"lease ends now, retry":        {rec(store.StateInProgress, "fp", store.LeaseRetry, now, future), storekit.ActTakeOver},
		"expired lease, resume":        {rec(store.StateInProgress, "fp", store.LeaseResume, past, future), storekit.ActTakeOver},
		"expired lease, unknown":       {rec(store.StateInProgress, "fp", store.LeaseUnknown, past, future), storekit.ActLeaseExpired},
		"expired lease, other request": {rec(store.StateInProgress, "x", store.LeaseRetry, past, future), storekit.ActExisting},
		"unknown past its lease":       {rec(store.StateUnknown, "fp", store.LeaseRetry, past, future), storekit.ActExisting},
		"unknown past expiry":          {rec(store.StateUnknown, "fp", store.LeaseRetry, past, past), storekit.ActExisting},
	} {
		if got := storekit.Decide(c.r, p, now); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}

func TestCheckCap(t *testing.T) {
	boom := errors.New("count failed")
	for name, c := range map[string]struct {
		max    int
		act    storekit.Action
		active int
		err    error // of the count
		want   error
		counts bool
	}{
		"no cap":                  {0, storekit.ActCreate, 9, nil, nil, false},
		"a duplicate at the cap":  {2, storekit.ActExisting, 2, nil, nil, false},
		"a takeover at the cap":   {2, storekit.ActTakeOver, 2, nil, nil, false},
		"an expiry at the cap":    {2, storekit.ActLeaseExpired, 2, nil, nil, false},
		"a creation under it":     {2, storekit.ActCreate, 1, nil, nil, true},
		"a creation at it":        {2, storekit.ActCreate, 2, nil, store.ErrOverCap, true},
		"a reclaim over it":       {2, storekit.ActReclaim, 3, nil, store.ErrOverCap, true},
		"a count that fails":      {2, storekit.ActCreate, 0, boom, boom, true},
		"a reclaim under the cap": {2, storekit.ActReclaim, 0, nil, nil, true},
	} {
		p := store.ReserveParams{MaxActive: c.max}
		counted := false
		err := storekit.CheckCap(&p, c.act, func() (int, error) { counted = true; return c.active, c.err })
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) || counted != c.counts {
			t.Errorf("%s: %v (counted %v), want %v (counted %v)", name, err, counted, c.want, c.counts)
		}
	}
}

func TestActivates(t *testing.T) {
	for a, want := range map[storekit.Action]bool{
		storekit.ActCreate: true, storekit.ActReclaim: true,
		storekit.ActExisting: false, storekit.ActTakeOver: false, storekit.ActLeaseExpired: false,
	} {
		if got := a.Activates(); got != want {
			t.Errorf("Action %d Activates() = %v, want %v", a, got, want)
		}
	}
}

// A nil request is stored as none, so that a MarkUnknown without a summary
// writes NULL rather than a JSON null.
func TestEncodeRequestNil(t *testing.T) {
	b, err := storekit.EncodeRequest(nil)
	if err != nil || b != nil {
		t.Fatalf("EncodeRequest(nil) = %q, %v; want nil, nil", b, err)
	}
}
