package idem

import (
	"net/http"
	"time"
)

// ExpiresHeader is the response header that tells the client when the
// key's record expires, as an HTTP-date (RFC 9110, whole seconds, rounded
// down): the stored answer is replayed to every retry until then, and a
// retry after it runs the request again. It is on every executed answer
// that was stored and on every replay. A completion starts the TTL over,
// so the date of an executed answer is a TTL after its completion.
const ExpiresHeader = "Idempotency-Key-Expires"

// setExpires sets ExpiresHeader to t, unless t is zero.
func setExpires(h http.Header, t time.Time) {
	if t.IsZero() {
		return
	}
	h[ExpiresHeader] = []string{t.UTC().Format(http.TimeFormat)}
}

// stampExpiry notes that the answer is being stored now: its record
// expires a TTL from now at the earliest.
func (x *Execution) stampExpiry() {
	x.expires.Store(x.e.clk.Now().Add(x.e.cfg.TTL).UnixNano())
}

// expiresAt is the expiry stamped by the completion that stored the
// answer, zero when it was not stored.
func (x *Execution) expiresAt() time.Time {
	if n := x.expires.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}
