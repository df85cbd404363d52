package redis

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// loseReply breaks the connection that carries the next call of one
// script once the server has run it: the script ran, and its caller never
// hears so, as when a connection breaks (a failover, a proxy or a network
// cutting it) between the write and its reply.
type loseReply struct {
	mu      sync.Mutex
	markers [][]byte // what a call of the armed script writes: its hash (EVALSHA) or its text (EVAL)
	fired   bool     // a reply was lost
}

// arm loses the reply of the next run of lua/<name>.lua.
func (h *loseReply) arm(t *testing.T, sc *goredis.Script, name string) {
	t.Helper()
	text, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.markers, h.fired = [][]byte{[]byte(sc.Hash()), text}, false
	h.mu.Unlock()
}

func (h *loseReply) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &losingConn{Conn: c, h: h}, nil
	}
}
func (h *loseReply) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *loseReply) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

type losingConn struct {
	net.Conn
	h       *loseReply
	markers [][]byte // the armed markers, while the command written last is the armed script's
}

func (c *losingConn) Write(b []byte) (int, error) {
	c.h.mu.Lock()
	for _, m := range c.h.markers {
		if bytes.Contains(b, m) {
			c.markers, c.h.markers = c.h.markers, nil
			break
		}
	}
	c.h.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *losingConn) Read(b []byte) (int, error) {
	if c.markers == nil {
		return c.Conn.Read(b)
	}
	n, err := c.Conn.Read(b)
	if n > 0 && b[0] == '-' {
		// An error reply (NOSCRIPT after a flush of the script cache):
		// the script did not run. Pass it on, and lose the reply of the
		// call that follows (EVAL).
		c.h.mu.Lock()
		c.h.markers, c.markers = c.markers, nil
		c.h.mu.Unlock()
		return n, err
	}
	// The reply came, so the script ran: drop it.
	c.h.mu.Lock()
	c.h.fired = true
	c.h.mu.Unlock()
	_ = c.Conn.Close()
	return 0, io.EOF
}

// TestLostReplyIsNotReplayed: a transition whose reply is lost may have
// been applied, and its caller must be told so (a retryable failure, which
// the engine then checks with a Get), never the answer of a second run of
// the script, which meets the first run's result: a Complete that landed
// reported as ErrLeaseLost (the engine then tells its client the answer was
// not stored), a Reserve that created the record reported as a duplicate in
// flight, a Delete that removed it reported as ErrNotFound. The client, as
// Open makes it, retries a command whose connection broke by itself.
func TestLostReplyIsNotReplayed(t *testing.T) {
	t.Parallel()
	hook := &loseReply{}
	client, prefix := hookedClient(t, hook)
	if client.Options().MaxRetries <= 0 {
		t.Fatalf("the client retries %d times; the test needs the default", client.Options().MaxRetries)
	}
	testLostReply(t, client, prefix, hook)
}

// testLostReply loses the replies of transitions run on client, whose
// connections hook dials.
func testLostReply(t *testing.T, client goredis.UniversalClient, prefix string, hook *loseReply) {
	clock := storetest.NewClock()
	s, err := New(client, Config{Prefix: prefix, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	lost := func(what string, err error) {
		t.Helper()
		hook.mu.Lock()
		fired := hook.fired
		hook.mu.Unlock()
		if !fired {
			t.Fatalf("%s: no reply was lost", what)
		}
		if !store.IsRetryable(err) {
			t.Errorf("%s whose reply was lost: %v, want a retryable failure (it may have been applied)", what, err)
		}
	}

	p := reserveParams("created")
	hook.arm(t, scriptReserve, "reserve")
	_, err = s.Reserve(ctx, p)
	lost("Reserve", err)
	rec, gerr := s.Get(ctx, p.Scope, p.Key)
	if gerr != nil || rec.State != store.StateInProgress {
		t.Fatalf("the lost Reserve was not applied: %v %v", rec.State, gerr)
	}

	hook.arm(t, scriptComplete, "complete")
	err = s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: store.Response{Status: 201}, TTL: time.Hour})
	lost("Complete", err)
	if errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Complete that landed reported %v", err)
	}
	if got, err := s.Get(ctx, p.Scope, p.Key); err != nil || got.State != store.StateCompleted || got.Fence != rec.Fence {
		t.Fatalf("the lost Complete was not applied: %v %v", got.State, err)
	}

	hook.arm(t, scriptDelete, "delete")
	err = s.Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key})
	lost("Delete", err)
	if _, err := s.Get(ctx, p.Scope, p.Key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the lost Delete was not applied: %v", err)
	}

	// The maintenance's scripts run in pipelines: a sweep whose reply was
	// lost must not be reported as a sweep that found nothing to move.
	rec = mustReserve(t, s, reserveParams("zombie"), store.Created)
	clock.Advance(time.Minute)
	hook.arm(t, scriptSweep, "sweep")
	swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10})
	lost("SweepExpiredLeases", err)
	if len(swept) != 0 {
		t.Errorf("SweepExpiredLeases whose reply was lost returned %d records", len(swept))
	}
	if got, err := s.Get(ctx, rec.Scope, rec.Key); err != nil || got.State != store.StateUnknown {
		t.Fatalf("the lost sweep was not applied: %v %v", got.State, err)
	}
}
