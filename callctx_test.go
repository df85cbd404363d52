package idem

import (
	"context"
	"errors"
	"testing"
	"time"
)

func newTestCallCtx(parent context.Context, timeout time.Duration, detached bool) *callCtx {
	c := new(callCtx)
	c.init(wallClock{}, parent, time.Now().Add(timeout), detached)
	return c
}

func TestCallCtxDeadlineWithoutDone(t *testing.T) {
	c := newTestCallCtx(context.Background(), 10*time.Millisecond, false)
	if c.Err() != nil {
		t.Fatal("fresh context already failed")
	}
	time.Sleep(15 * time.Millisecond)
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err after the deadline: %v", c.Err())
	}
	// Asking for Done after the deadline gets a closed channel at once.
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed after the deadline")
	}
	c.release()
}

func TestCallCtxDoneFiresAtDeadline(t *testing.T) {
	c := newTestCallCtx(context.Background(), 20*time.Millisecond, false)
	done := c.Done()
	if c.Err() != nil {
		t.Fatal("Err before Done closed")
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Done never closed")
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err: %v", c.Err())
	}
	if d, ok := c.Deadline(); !ok || d.IsZero() {
		t.Fatal("no deadline")
	}
	c.release()
}

func TestCallCtxParentCancellation(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	attached := newTestCallCtx(parent, time.Minute, false)
	detached := newTestCallCtx(parent, time.Minute, true)
	ad, dd := attached.Done(), detached.Done()
	cancel()
	select {
	case <-ad:
	case <-time.After(5 * time.Second):
		t.Fatal("parent cancellation did not reach the attached context")
	}
	if !errors.Is(attached.Err(), context.Canceled) {
		t.Fatalf("attached Err: %v", attached.Err())
	}
	select {
	case <-dd:
		t.Fatal("parent cancellation reached the detached context")
	default:
	}
	if detached.Err() != nil || detached.Value(ctxKey{}) != "v" {
		t.Fatalf("detached: Err %v, value %v", detached.Err(), detached.Value(ctxKey{}))
	}
	// Unarmed: the parent's state is read directly.
	lazy := newTestCallCtx(parent, time.Minute, false)
	if !errors.Is(lazy.Err(), context.Canceled) {
		t.Fatalf("unarmed attached Err: %v", lazy.Err())
	}
	attached.release()
	detached.release()
	if !errors.Is(detached.Err(), context.Canceled) {
		t.Fatalf("released context Err: %v", detached.Err())
	}
}

func TestCallCtxParentDeadlineIsEarlier(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c := newTestCallCtx(parent, time.Hour, false)
	if d, _ := c.Deadline(); time.Until(d) > 2*time.Second {
		t.Fatalf("deadline %v ignores the parent's", d)
	}
	if d, _ := newTestCallCtx(parent, time.Hour, true).Deadline(); time.Until(d) < time.Minute {
		t.Fatal("a detached context took the parent's deadline")
	}
}

func TestCallCtxAfterFunc(t *testing.T) {
	c := newTestCallCtx(context.Background(), 20*time.Millisecond, false)
	ran := make(chan struct{})
	context.AfterFunc(c, func() { close(ran) })
	stopped := context.AfterFunc(c, func() { t.Error("a stopped AfterFunc ran") })
	if !stopped() {
		t.Fatal("stop of a pending AfterFunc returned false")
	}
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFunc did not run at the deadline")
	}
	if stopped() {
		t.Fatal("second stop returned true")
	}
	// Registered after the context is done: runs at once.
	late := make(chan struct{})
	context.AfterFunc(c, func() { close(late) })
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFunc on a done context did not run")
	}
	c.release()
}
