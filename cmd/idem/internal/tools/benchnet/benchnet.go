// Package benchnet holds what the benchmark commands share to run servers
// as separate processes: a free loopback address, and a wait until a
// process listens on it.
package benchnet

import (
	"errors"
	"net"
	"time"
)

// FreeAddr returns a loopback address with a port nothing listens on now.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// WaitListening waits up to 30 seconds until addr accepts connections.
func WaitListening(addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("did not start listening within 30s")
}
