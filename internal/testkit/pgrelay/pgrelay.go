// Package pgrelay is a TCP relay in front of a PostgreSQL server that can
// lose the answer of a committed statement, for tests of what a client
// does when a write was applied and its answer never came.
package pgrelay

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay relays TCP connections to a PostgreSQL server. Once armed, it
// closes the connection that carries the first statement answered with a
// row, instead of passing on the ReadyForQuery that follows it: the server
// has committed the statement's implicit transaction by then. While Down
// is set after a cut, it closes every new connection at once, as a server
// out of reach.
type Relay struct {
	// URL is the server's URL with the relay's address in its place.
	URL   string
	armed atomic.Bool
	cut   atomic.Bool
	down  atomic.Bool
}

// New starts a relay to the server of target, a PostgreSQL URL, closed
// when t ends.
func New(t testing.TB, target string) *Relay {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	server := u.Host
	if u.Port() == "" {
		server = net.JoinHostPort(u.Hostname(), "5432")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	r := &Relay{URL: u.String()}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.relay(c, server)
			}()
		}
	}()
	return r
}

// Arm makes the relay cut the next statement answered with a row.
func (r *Relay) Arm() { r.armed.Store(true) }

// Cut reports whether the relay cut a connection.
func (r *Relay) Cut() bool { return r.cut.Load() }

// SetDown sets whether, once a connection was cut, the server is out of
// reach.
func (r *Relay) SetDown(down bool) { r.down.Store(down) }

func (r *Relay) relay(client net.Conn, server string) {
	defer client.Close()
	if r.cut.Load() && r.down.Load() {
		return
	}
	s, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		_, _ = io.Copy(s, client)
		s.Close()
	}()
	// Server to client, message by message: a type byte, then a length
	// that counts itself.
	sawRow := false
	head := make([]byte, 5)
	for {
		if _, err := io.ReadFull(s, head); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(head[1:]))-4)
		if _, err := io.ReadFull(s, body); err != nil {
			return
		}
		switch head[0] {
		case 'D':
			sawRow = true
		case 'Z':
			if sawRow && r.armed.CompareAndSwap(true, false) {
				r.cut.Store(true)
				return // the commit's answer is lost with the connection
			}
			sawRow = false
		}
		if _, err := client.Write(append(head, body...)); err != nil {
			return
		}
	}
}
