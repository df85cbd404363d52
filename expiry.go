package idem

import (
	"net/http"
	"sync/atomic"
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
	h[ExpiresHeader] = expiresValue(t)
}

// expiresFormatted is one formatted expiry: the value of the header for
// every instant within the second sec.
type expiresFormatted struct {
	sec int64
	v   []string
}

// lastExpires keeps the last value formatted. Answers given within one
// second share their expiry's second (a replay of one record, new records
// under one TTL), so most answers reuse it and cost no allocation. The
// slice is shared between answers: its capacity is its length, so an
// Add appends to a copy.
var lastExpires atomic.Pointer[expiresFormatted]

func expiresValue(t time.Time) []string {
	sec := t.Unix()
	if f := lastExpires.Load(); f != nil && f.sec == sec {
		return f.v
	}
	v := []string{t.UTC().Format(http.TimeFormat)}
	lastExpires.Store(&expiresFormatted{sec: sec, v: v[:1:1]})
	return v[:1:1]
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
