package idem

import (
	"strconv"
	"testing"
	"time"
)

// The buckets of idle tenants are dropped once there are many: the
// limiter's memory does not grow with the number of tenants ever seen.
func TestTenantLimiterIsBounded(t *testing.T) {
	l := newTenantLimiter(1, 2)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range limiterIdle {
		if ok, _ := l.take(strconv.Itoa(i), now); !ok {
			t.Fatalf("tenant %d: the first key was refused", i)
		}
	}
	if l.size() != limiterIdle {
		t.Fatalf("%d buckets, want %d", l.size(), limiterIdle)
	}
	// One second on, every bucket refilled: the next new tenant prunes them.
	now = now.Add(time.Second)
	l.take("busy", now)
	l.take("busy", now)
	if ok, _ := l.take("new", now); !ok || l.size() != 2 {
		t.Fatalf("after the idle buckets refilled: %d buckets, want 2", l.size())
	}
	// A bucket still drained is kept: its tenant would otherwise get a
	// full burst again. The next prune waits until the buckets doubled.
	for i := range limiterIdle {
		l.take("x"+strconv.Itoa(i), now)
	}
	if ok, wait := l.take("busy", now); ok || wait != time.Second {
		t.Fatalf("the drained bucket was dropped: %v %v", ok, wait)
	}
}

// With every bucket busy, pruning does not run at every new tenant: the
// threshold doubles past what a prune left.
func TestTenantLimiterPrunesRarely(t *testing.T) {
	l := newTenantLimiter(0.001, 1)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range limiterIdle + 1 {
		l.take(strconv.Itoa(i), now)
	}
	if l.prune != 2*limiterIdle {
		t.Fatalf("threshold %d after a prune that dropped nothing, want %d", l.prune, 2*limiterIdle)
	}
	for i := range limiterIdle {
		l.take("more-"+strconv.Itoa(i), now)
	}
	if l.size() != 2*limiterIdle+1 || l.prune != 4*limiterIdle {
		t.Fatalf("%d buckets, threshold %d", l.size(), l.prune)
	}
}

// A refund never lifts a bucket past its burst: a token taken, then
// refilled by time, then refunded leaves the burst, not one more.
func TestTenantLimiterRefundStaysWithinTheBurst(t *testing.T) {
	l := newTenantLimiter(1, 2)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if ok, _ := l.take("t", now); !ok {
		t.Fatal("first key refused")
	}
	now = now.Add(time.Hour) // refilled to the burst meanwhile
	l.take("t", now)
	l.refund("t")
	l.refund("t") // the first call's refund, late
	n := 0
	for ; n < 10; n++ {
		if ok, _ := l.take("t", now); !ok {
			break
		}
	}
	if n != 2 {
		t.Fatalf("%d keys admitted at once after the refunds; the burst is 2", n)
	}
}
