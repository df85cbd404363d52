// Package replay knows which response headers a stored answer may carry
// back to a retry: the middleware, the settlement of unknown outcomes and
// the proxy's resolve protocol store responses by the same rule.
package replay

import (
	"bytes"
	"net/http"
)

// unreplayable are the headers never stored for replay: hop-by-hop
// headers (RFC 9110 §7.6.1), cookies (a replay must not hand one caller's
// session to a retry), Date (the replay gets its own), and the engine's
// own markers.
var unreplayable = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Set-Cookie": true, "Set-Cookie2": true, "Date": true, "Idempotent-Replayed": true, "Idempotent-Body-Omitted": true,
}

// Unreplayable reports whether a header (in canonical form) is never
// stored for replay, whatever the Connection header says.
func Unreplayable(name string) bool { return unreplayable[name] }

// Header copies h without the headers a replay must not carry, including
// those named by Connection. The value slices are shared with h, capped so
// that an Add on either side copies instead of writing into the other;
// net/http treats header values as immutable once set.
func Header(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	named := h["Connection"]
	out := make(http.Header, len(h))
	for k, v := range h {
		if unreplayable[k] || listed(named, k) {
			continue
		}
		out[k] = v[:len(v):len(v)]
	}
	return out
}

// listed reports whether a Connection header names name.
func listed(connection []string, name string) bool {
	for _, line := range connection {
		for _, tok := range bytes.Split([]byte(line), []byte(",")) {
			if http.CanonicalHeaderKey(string(bytes.TrimSpace(tok))) == name {
				return true
			}
		}
	}
	return false
}
