// Package httpfield holds idem's rules on HTTP header fields: which are
// well-formed (Valid) and which a stored answer may keep and replay
// (Replayable). The engine, the background services and the binary filter
// every answer they store through it, and the store contract checks a
// pending request's fields with it; it imports nothing but the standard
// library, so the contract stays free of dependencies.
package httpfield

import (
	"mime"
	"net/http"
	"slices"
	"strings"
)

// unreplayable are the headers a stored answer never keeps: hop-by-hop
// headers (RFC 9110 §7.6.1), cookies (a replay must not hand one caller's
// session to a retry), Date (a replay gets its own), Content-Length (the
// replay computes it from the body it writes) and the engine's own markers.
var unreplayable = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Set-Cookie": true, "Set-Cookie2": true, "Date": true, "Content-Length": true,
	"Idempotent-Replayed": true, "Idempotent-Body-Omitted": true,
}

// ReplayableName reports whether a header of this name may be kept for
// replay (Connection-named headers aside; see Replayable). Names are
// compared in their canonical form: a handler may write a field under any
// spelling (w.Header()["set-cookie"]), net/http sends it as written, and
// clients read names without regard to case.
func ReplayableName(name string) bool {
	if unreplayable[name] {
		return false
	}
	if isCanonical(name) {
		return true
	}
	return !unreplayable[http.CanonicalHeaderKey(name)]
}

// isCanonical reports whether http.CanonicalHeaderKey would return name
// as it is because its letters already have their canonical case (upper
// first and after each '-', lower elsewhere). It is a shortcut only: a
// false answer says nothing (CanonicalHeaderKey also leaves alone a name
// with bytes outside a token).
func isCanonical(name string) bool {
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return false
		}
		upper = c == '-'
	}
	return true
}

// Connection returns the values of h's Connection field, under any
// spelling of its name: the fields it names are hop-by-hop too.
func Connection(h http.Header) []string { return Values(h, "Connection") }

// Values returns the values of the field name (in canonical form) under
// any spelling in h: a map written directly may hold "connection" or
// "idempotency-key", which net/http sends as written and a server reads
// without regard to case.
func Values(h http.Header, name string) []string {
	values := h[name]
	for k, v := range h {
		if len(k) == len(name) && k != name && strings.EqualFold(k, name) {
			values = append(values[:len(values):len(values)], v...)
		}
	}
	return values
}

// Replayable returns the headers of h that a stored answer may keep:
// it drops the unreplayable ones, those named by h's Connection header, and
// any whose name is not an HTTP token or whose value holds a control
// character other than horizontal tab. Every path that stores an answer
// (the engine, resolvers, operators, webhooks) filters through it, and the
// replay filters again.
//
// The value slices are shared with h, capped so that an Add on either side
// copies instead of writing into the other; net/http treats header values as
// immutable once set.
func Replayable(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	named := Connection(h)
	out := make(http.Header, len(h))
	for k, v := range h {
		if keeps(named, k, v) {
			out[k] = v[:len(v):len(v)]
		}
	}
	return out
}

// keeps reports whether Replayable keeps the field k: v of a header whose
// Connection field is named.
func keeps(named []string, k string, v []string) bool {
	return ReplayableName(k) && !listed(named, k) && Valid(k, v)
}

// IsReplayable reports whether r, a header Replayable returned, is what
// Replayable(h) returns (the same fields and values), without building it:
// a caller that kept r may then use it in place of a new copy.
func IsReplayable(r, h http.Header) bool {
	if len(h) == 0 || r == nil {
		return len(h) == 0 && r == nil
	}
	named := Connection(h)
	n := 0
	for k, v := range h {
		if !keeps(named, k, v) {
			continue
		}
		if w, ok := r[k]; !ok || !slices.Equal(v, w) {
			return false
		}
		n++
	}
	return n == len(r)
}

// Valid reports whether name is an RFC 9110 token and no value holds a
// control character (other than horizontal tab) or DEL: a field net/http
// would send as it is.
func Valid(name string, values []string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !tokenBytes[name[i]] {
			return false
		}
	}
	for _, v := range values {
		for i := 0; i < len(v); i++ {
			if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
				return false
			}
		}
	}
	return true
}

// tokenBytes marks the bytes of an RFC 9110 token.
var tokenBytes = func() (t [256]bool) {
	for c := range t {
		b := byte(c)
		t[c] = 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
	}
	return t
}()

// listed reports whether a Connection header lists name (in any spelling).
func listed(connection []string, name string) bool {
	for _, line := range connection {
		for tok := range strings.SplitSeq(line, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), name) {
				return true
			}
		}
	}
	return false
}

// IsEventStream reports whether h announces an event stream
// (text/event-stream): an answer sent as it is written, never stored
// first.
func IsEventStream(h http.Header) bool {
	ct := h["Content-Type"]
	if len(ct) == 0 || !strings.HasPrefix(ct[0], "text/event-stream") {
		return false
	}
	t, _, err := mime.ParseMediaType(ct[0])
	return err == nil && t == "text/event-stream"
}
