package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// callCtx bounds one store call by a deadline, optionally detached from its
// parent's cancellation (a completion must be recorded even when the
// client hung up). It is context.WithTimeout without the cost on the common
// path: the timer and the Done channel exist only if the store asks for
// Done; a store that only checks Err (the memory store) gets the deadline
// from a clock read.
type callCtx struct {
	clk      clock
	parent   context.Context
	deadline time.Time
	detached bool

	mu sync.Mutex
	// armed: Done was handed out. Set under mu; read without it on the
	// paths where it is false (a store that never asks for Done), so that
	// they take no lock.
	armed      atomic.Bool
	done       chan struct{}
	err        error
	timer      timer
	stopParent func() bool
	afters     map[int]func()
	nextAfter  int
}

// init prepares a zero callCtx ending at deadline; a callCtx is used for
// one call only.
func (c *callCtx) init(clk clock, parent context.Context, deadline time.Time, detached bool) {
	c.clk, c.parent, c.deadline, c.detached = clk, parent, deadline, detached
}

func (c *callCtx) Deadline() (time.Time, bool) {
	if !c.detached {
		if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
			return d, true
		}
	}
	return c.deadline, true
}

func (c *callCtx) Value(key any) any { return c.parent.Value(key) }

// Err follows the context contract: once Done was handed out, Err is
// non-nil exactly when Done is closed.
func (c *callCtx) Err() error {
	if !c.armed.Load() {
		return c.cause()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// cause is the error the context has now, judged without a channel.
func (c *callCtx) cause() error {
	if !c.detached {
		if err := c.parent.Err(); err != nil {
			return err
		}
	}
	if c.clk.Until(c.deadline) <= 0 {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed.Load() {
		c.armed.Store(true)
		c.done = make(chan struct{})
		if err := c.cause(); err != nil {
			c.err = err
			close(c.done)
			return c.done
		}
		c.timer = c.clk.AfterFunc(c.clk.Until(c.deadline), func() { c.cancel(context.DeadlineExceeded) })
		if !c.detached && c.parent.Done() != nil {
			c.stopParent = context.AfterFunc(c.parent, func() { c.cancel(c.parent.Err()) })
		}
	}
	return c.done
}

func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
		for _, f := range c.afters {
			go f()
		}
		c.afters = nil
	}
}

// AfterFunc arranges for f to run in its own goroutine once the context is
// done, as context.AfterFunc does. Drivers (pgx) register one per query:
// without this method the context package would start a goroutine per
// query to watch Done.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.Done() // arms the deadline and the parent watch
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	if c.afters == nil {
		c.afters = map[int]func(){}
	}
	id := c.nextAfter
	c.nextAfter++
	c.afters[id] = f
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, pending := c.afters[id]
		delete(c.afters, id)
		return pending
	}
}

// release stops the timer and the parent watch, as a CancelFunc would. The
// context reports context.Canceled afterwards if it was armed.
func (c *callCtx) release() {
	if !c.armed.Load() {
		return
	}
	c.mu.Lock() // Done may still be arming
	t, stopParent := c.timer, c.stopParent
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	if stopParent != nil {
		stopParent()
	}
	c.cancel(context.Canceled)
}
