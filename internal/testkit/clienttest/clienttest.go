// Package clienttest holds what the tests of the retrying client share,
// in package client and in front of the proxy: a test clock, a transport
// that counts closed responses and a TCP relay that cuts connections.
package clienttest

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/store/storetest"
)

// Clock is the time of a test: the manual clock of the store suite, which
// stands still unless a wait moves it. Sleep records the waits and moves
// the clock by them, then returns at once (or runs OnSleep), and Jitter
// keeps the computed wait, so the delays are exact.
type Clock struct {
	*storetest.Clock
	mu      sync.Mutex
	delays  []time.Duration
	OnSleep func(ctx context.Context, d time.Duration) error
}

func NewClock() *Clock { return &Clock{Clock: storetest.NewClock()} }

func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.delays = append(c.delays, d)
	c.Advance(d)
	hook := c.OnSleep
	c.mu.Unlock()
	if hook != nil {
		return hook(ctx, d)
	}
	return ctx.Err()
}

func (c *Clock) Delays() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.delays...)
}

// Tracked counts the responses its transport hands out and those whose
// body was closed: every response the retrying transport discards must be
// closed, and only the one it returns may stay open.
type Tracked struct {
	base   http.RoundTripper
	Issued atomic.Int32
	Closed atomic.Int32
}

func (tr *Tracked) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := tr.base.RoundTrip(r)
	if resp != nil {
		tr.Issued.Add(1)
		resp.Body = &closeCounter{ReadCloser: resp.Body, n: &tr.Closed}
	}
	return resp, err
}

type closeCounter struct {
	io.ReadCloser
	n    *atomic.Int32
	once sync.Once
}

func (c *closeCounter) Close() error {
	c.once.Do(func() { c.n.Add(1) })
	return c.ReadCloser.Close()
}

// NewTransport returns a Transport over a fresh connection per attempt, so
// that a cut connection is seen by the retrying transport and not hidden by
// net/http's own re-send on a reused connection, with c's time.
func NewTransport(t *testing.T, c *Clock) (*client.Transport, *Tracked) {
	base := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(base.CloseIdleConnections)
	tr := &Tracked{base: base}
	return &client.Transport{Base: tr, Now: c.Now, Sleep: c.Sleep, Jitter: func(d time.Duration) time.Duration { return d }}, tr
}

func Post(t *testing.T, ctx context.Context, tr http.RoundTripper, url, body string, hdr ...string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	return resp, b, nil
}

// Relay is a TCP hop between the client and a server, where the tests cut
// connections as a network would: the server keeps running, and only what
// travels back to the client is lost.
type Relay struct {
	ln     net.Listener
	target string
	// drop: the next drop connections lose their response: when the
	// server starts answering, both sides are closed and nothing of the
	// answer reaches the client.
	Drop atomic.Int32
	// dropped receives a value each time a response was dropped, or was
	// lost because the client side had been cut.
	Dropped chan struct{}

	mu      sync.Mutex
	clients map[net.Conn]*hop
	wg      sync.WaitGroup
}

type hop struct {
	client, server net.Conn
	cut            atomic.Bool
}

func NewRelay(t *testing.T, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{ln: ln, target: target, Dropped: make(chan struct{}, 16), clients: map[net.Conn]*hop{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.Close)
	return r
}

func (r *Relay) URL() string { return "http://" + r.ln.Addr().String() }

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		h := &hop{client: c, server: s}
		r.mu.Lock()
		r.clients[c] = h
		r.mu.Unlock()
		drop := false
		if r.Drop.Load() > 0 {
			drop = r.Drop.Add(-1) >= 0
		}
		r.wg.Add(2)
		go r.upstream(h)
		go r.downstream(h, drop)
	}
}

// upstream forwards the client's bytes. When the client side was cut on
// purpose the server side stays open, as a server does not notice a cable
// pulled on the far side of a network until it writes.
func (r *Relay) upstream(h *hop) {
	defer r.wg.Done()
	io.Copy(h.server, h.client)
	if !h.cut.Load() {
		h.server.Close()
	}
}

func (r *Relay) downstream(h *hop, drop bool) {
	defer r.wg.Done()
	defer r.forget(h)
	if drop {
		var b [1]byte
		h.server.Read(b[:]) // the server has started answering: it ran
		h.cut.Store(true)
		h.client.Close()
		h.server.Close()
		r.Dropped <- struct{}{}
		return
	}
	io.Copy(h.client, h.server)
	if h.cut.Load() {
		// The answer, or its first bytes, met a closed client side.
		r.Dropped <- struct{}{}
	}
	h.client.Close()
	h.server.Close()
}

func (r *Relay) forget(h *hop) {
	r.mu.Lock()
	delete(r.clients, h.client)
	r.mu.Unlock()
}

// CutClients closes the client side of every open connection, as a
// network failure would, while the server side stays open.
func (r *Relay) CutClients() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, h := range r.clients {
		h.cut.Store(true)
		c.Close()
	}
}

// Close stops the relay and closes every connection.
func (r *Relay) Close() {
	r.ln.Close()
	r.mu.Lock()
	for c, h := range r.clients {
		c.Close()
		h.server.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// CheckAllClosed fails t unless every response tr issued was closed.
func CheckAllClosed(t *testing.T, tr *Tracked) {
	t.Helper()
	if issued, closed := tr.Issued.Load(), tr.Closed.Load(); issued != closed {
		t.Errorf("%d responses issued, %d closed", issued, closed)
	}
}
