package idem

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// fakeClock is a clock whose timers fire only when the test says so.
type fakeClock struct {
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c      *fakeClock
	when   time.Time
	f      func()
	active bool
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Until(t time.Time) time.Duration { return t.Sub(c.now) }

func (c *fakeClock) AfterFunc(d time.Duration, f func()) timer {
	t := &fakeTimer{c: c, when: c.now.Add(d), f: f, active: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	was := t.active
	t.when, t.active = t.c.now.Add(d), true
	return was
}

// advance moves the clock to now+d, firing the timer of h that falls due
// at its own instant. The timers other code made (startHeartbeat's, which
// would run Execution.renew) are not run: started records when each was
// set to fire.
func (c *fakeClock) advance(d time.Duration, h *heartbeats, started map[timer]time.Time) {
	end := c.now.Add(d)
	for {
		for _, t := range c.timers {
			if t.active && timer(t) != h.timer {
				started[t], t.active = t.when, false
			}
		}
		t, _ := h.timer.(*fakeTimer)
		if t == nil || !t.active || t.when.After(end) {
			c.now = end
			return
		}
		t.active = false
		c.now = t.when
		t.f()
	}
}

// TestHeartbeats checks the queue of first renewals against a model. Every
// execution's first renewal starts when it falls due, a third into its
// lease, and no later than a timer of its own set when it was queued would
// have fired; never for one that finished first. The queue stays ordered by
// due time, with the timer set for its head, or stopped when it is empty.
func TestHeartbeats(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const lease = 30 * time.Second
		clk := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
		h := newHeartbeats(lease)
		e := &Engine{beats: h}
		var live, finished []*Execution
		added := map[*Execution]time.Time{}
		started := map[timer]time.Time{}
		t.Repeat(map[string]func(*rapid.T){
			"reserve": func(t *rapid.T) {
				// The lease started when the reservation did, a little
				// before now (the store call's time).
				back := time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "back"))
				x := &Execution{e: e, leaseEnd: clk.now.Add(-back).Add(lease)}
				added[x] = clk.now
				h.add(clk, x, lease/3)
				live = append(live, x)
			},
			"finish": func(t *rapid.T) {
				if len(live) == 0 {
					t.Skip("nothing live")
				}
				i := rapid.IntRange(0, len(live)-1).Draw(t, "i")
				x := live[i]
				live = slices.Delete(live, i, i+1)
				x.finish()
				finished = append(finished, x)
			},
			"advance": func(t *rapid.T) {
				clk.advance(time.Duration(rapid.Int64Range(0, int64(lease)).Draw(t, "d")), h, started)
			},
			"": func(t *rapid.T) {
				var queued []*Execution
				var prev *Execution
				for x := h.head; x != nil; x = x.next {
					if x.prev != prev {
						t.Fatalf("broken back link")
					}
					if prev != nil && h.due(x).Before(h.due(prev)) {
						t.Fatalf("queue out of order")
					}
					queued = append(queued, x)
					prev = x
				}
				if h.tail != prev {
					t.Fatalf("tail is not the last")
				}
				for _, x := range finished {
					if slices.Contains(queued, x) || x.heartbeat != nil && x.heartbeat.(*fakeTimer).active {
						t.Fatalf("a finished execution still has a heartbeat")
					}
				}
				for _, x := range live {
					due, latest := h.due(x), added[x].Add(lease/3)
					if slices.Contains(queued, x) {
						if x.heartbeat != nil {
							t.Fatalf("queued with a timer of its own")
						}
						if !clk.now.Before(latest) {
							t.Fatalf("first renewal overdue: due %v, now %v", due, clk.now)
						}
						continue
					}
					at, ok := started[x.heartbeat]
					if x.heartbeat == nil || !ok {
						t.Fatalf("neither queued nor renewing")
					}
					if at.Before(due) || at.After(latest) {
						t.Fatalf("first renewal at %v, want it in [%v, %v]", at, due, latest)
					}
				}
				tm, _ := h.timer.(*fakeTimer)
				armed := tm != nil && tm.active
				switch {
				case h.head == nil && armed:
					t.Fatalf("timer set for an empty queue")
				case h.head != nil && !armed:
					t.Fatalf("no timer for a queue")
				case h.head != nil && tm.when.After(added[h.head].Add(lease/3)):
					// Earlier is allowed: the head it was set for
					// finished, and the timer sets itself again.
					t.Fatalf("timer at %v, after the head's latest %v", tm.when, added[h.head].Add(lease/3))
				}
			},
		})
	})
}
