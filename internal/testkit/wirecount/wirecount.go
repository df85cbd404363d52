// Package wirecount counts the writes an http.Transport makes to its
// connections: net/http writes a request's head and an in-memory body in
// one write, and flushes the head first for a body it cannot tell is in
// memory.
package wirecount

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// Upstream is an HTTP server that answers 201 Created and keeps the body
// of the last request, and a transport to it whose writes are counted.
type Upstream struct {
	URL       string
	Transport *http.Transport
	dialer    Dialer
	body      atomic.Value // string
}

// NewUpstream starts an Upstream that stops with the test.
func NewUpstream(t testing.TB) *Upstream {
	u := &Upstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.body.Store(string(b))
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	u.Transport = &http.Transport{DialContext: u.dialer.DialContext}
	t.Cleanup(u.Transport.CloseIdleConnections)
	return u
}

// Body returns the body of the last request the server got.
func (u *Upstream) Body() string { s, _ := u.body.Load().(string); return s }

// Writes returns the number of writes Transport made so far.
func (u *Upstream) Writes() int64 { return u.dialer.Writes() }

// Dialer dials TCP and counts the Write calls on every connection it
// made. Use its DialContext as an http.Transport's.
type Dialer struct {
	d      net.Dialer
	writes atomic.Int64
}

// DialContext dials like net.Dialer's and counts the writes to the
// connection.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := d.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, writes: &d.writes}, nil
}

// Writes returns the number of Write calls so far.
func (d *Dialer) Writes() int64 { return d.writes.Load() }

type conn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *conn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
