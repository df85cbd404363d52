package idem

import ()

// Clock and Timer let tests step the engine's time.
type (
	Clock = clock
	Timer = timer
)

// SetClock makes e (and the engines later derived from it) read c.
func SetClock(e *Engine, c Clock) { e.clk = c }

// FingerprintOf is the engine's fingerprint of an HTTP request body.
func (e *Engine) FingerprintOf(method, route, target, contentType string, body []byte) (string, error) {
	return e.fingerprint(&Call{Method: method, Route: route, Target: target, ContentType: contentType, Body: body})
}

// Protected reports whether e puts requests with method m through the
// protocol, and under which spelling.
func (e *Engine) Protected(m string) (string, bool) { return e.cfg.protected(m) }

// ReadBody is the middleware's body reader.
var ReadBody = readBody
