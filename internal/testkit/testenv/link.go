package testenv

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Link is a TCP path to a server that can stall: from then on it carries
// no byte either way and keeps its connections open, as a server that
// hangs, or a network that drops packets instead of refusing them, does.
type Link struct {
	ln      net.Listener
	stalled atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

// NewLink carries every connection made to its Addr to target until the
// test ends.
func NewLink(tb testing.TB, target string) *Link {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	l := &Link{ln: ln}
	tb.Cleanup(l.close)
	go l.accept(target)
	return l
}

// Addr is the address to connect to instead of the server's.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Stall stops the link for good.
func (l *Link) Stall() { l.stalled.Store(true) }

func (l *Link) accept(target string) {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		l.mu.Lock()
		l.conns = append(l.conns, c, s)
		l.mu.Unlock()
		go l.carry(c, s)
		go l.carry(s, c)
	}
}

// carry copies src to dst until either closes, dropping what it reads
// once the link stalled.
func (l *Link) carry(dst, src net.Conn) {
	b := make([]byte, 32<<10)
	for {
		n, err := src.Read(b)
		if err != nil {
			return
		}
		if l.stalled.Load() {
			continue
		}
		if _, err := dst.Write(b[:n]); err != nil {
			return
		}
	}
}

func (l *Link) close() {
	l.ln.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}
