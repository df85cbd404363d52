package idem

import (
	"sync"
	"time"
)

// heartbeats schedules the first lease renewal of an engine's executions
// with one timer. Almost every request ends long before a third of its
// lease has passed, so a timer of its own per execution (two allocations
// and two operations on the runtime's timer heap) would be started and
// stopped for nothing; a place in this list costs a lock and a few pointer
// writes. An execution still running at its first renewal gets a timer of
// its own then, which its later renewals reset (Execution.renew).
type heartbeats struct {
	// early is how long before the end of a lease its first renewal is
	// due: a queued execution's due time is its leaseEnd less early,
	// which nothing changes while it is queued.
	early time.Duration

	mu sync.Mutex
	// head and tail: the queued executions, earliest due first (linked
	// through Execution.prev and next).
	head, tail *Execution
	timer      timer
	clk        clock // the clock timer was made on
	// armed: timer is set, to fire no later than the latest first renewal
	// of any queued execution (see add), and stopped with an empty queue.
	armed bool
}

func newHeartbeats(lease time.Duration) *heartbeats {
	return &heartbeats{early: lease - lease/3}
}

func (h *heartbeats) due(x *Execution) time.Time { return x.leaseEnd.Add(-h.early) }

// add queues x's first renewal, due a third into its lease, which is at
// most delay from now (delay is the lease's third and the lease started
// when the reservation did). A renewal starts no later than a timer of x's
// own set now would have fired: a timer set for an empty queue fires after
// delay, without reading the clock, which is no later than for anything
// queued after; once it fired, it is set for the head's due time.
func (h *heartbeats) add(clk clock, x *Execution, delay time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	due := h.due(x)
	// Due times arrive almost in order: look for the place from the tail.
	p := h.tail
	for p != nil && h.due(p).After(due) {
		p = p.prev
	}
	x.prev = p
	if p == nil {
		x.next, h.head = h.head, x
	} else {
		x.next, p.next = p.next, x
	}
	if x.next == nil {
		h.tail = x
	} else {
		x.next.prev = x
	}
	if !h.armed {
		h.arm(clk, delay)
	}
}

// arm sets the timer to fire after delay; h.mu is held.
func (h *heartbeats) arm(clk clock, delay time.Duration) {
	h.armed = true
	if h.timer == nil || h.clk != clk {
		if h.timer != nil {
			h.timer.Stop()
		}
		h.timer, h.clk = clk.AfterFunc(delay, h.fire), clk
		return
	}
	h.timer.Reset(delay)
}

// remove takes x out of the queue if it is still there (it ended before
// its first renewal). The timer stops with the last one.
func (h *heartbeats) remove(x *Execution) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if x.prev == nil && h.head != x {
		return // not queued
	}
	h.unlink(x)
	if h.head == nil && h.armed {
		h.timer.Stop()
		h.armed = false
	}
}

// unlink takes x out of the list; h.mu is held.
func (h *heartbeats) unlink(x *Execution) {
	if x.prev == nil {
		h.head = x.next
	} else {
		x.prev.next = x.next
	}
	if x.next == nil {
		h.tail = x.prev
	} else {
		x.next.prev = x.prev
	}
	x.prev, x.next = nil, nil
}

// fire starts the renewals that are due and sets the timer for the next.
func (h *heartbeats) fire() {
	h.mu.Lock()
	clk := h.clk
	now := clk.Now()
	var due []*Execution
	for h.head != nil && !h.due(h.head).After(now) {
		x := h.head
		h.unlink(x)
		due = append(due, x)
	}
	h.armed = false
	if h.head != nil {
		h.arm(clk, h.due(h.head).Sub(now))
	}
	h.mu.Unlock()
	// Out of h.mu: Execution.finish takes x.mu, then h.mu.
	for _, x := range due {
		x.startHeartbeat(clk)
	}
}
